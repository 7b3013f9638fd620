//! The checkpoint scripts: the fenced write (which prunes the thread to its retention in the
//! same step), the trim and count that checkpoint cleanup and stats run per thread, and the
//! reads' clean-up of index entries whose payload expired.
//!
//! Every script touches one thread's keys only: its index and lease, given as `KEYS`, and the
//! payload and sequence keys of the ids it finds in the index, named from the thread's key
//! prefixes (given as `ARGV`), which carry the thread's hash tag: on a Redis Cluster they all
//! live in the thread's slot. An index member that is not an id (a UUID's 36 characters) never
//! becomes a key name, so no script reaches outside that slot.

/// Lua shared by the scripts below.
///
/// - `cp_links(key)` reads a checkpoint's run, base and parent (base and parent `nil` for a
///   whole snapshot) from the header of its value ([`super::Header`]), or from the fields of
///   the hash earlier releases wrote; `nil` when the key holds neither.
/// - `prune_oldest(index, excess, budget, cp_prefix, seq_prefix, spare)` removes up to
///   `budget` of the `excess` oldest entries of the index with their payloads, and the
///   sequence keys of the runs that wrote them, except run `spare` (the run writing, or holding
///   the thread's lease): only a live run writes checkpoints, so only its sequence is needed to
///   refuse a stale write. It stops at the base of the oldest entry the thread keeps (the entry
///   at rank `excess`; a delta's `base` field): what a kept checkpoint builds on stays. The
///   bound is found from the entries kept in the end, not from the first `budget`: a chain
///   longer than the budget is pruned over several calls. Returns how many entries went.
/// - `prune_skipped(index, keep, budget, cp_prefix)` removes up to `budget` entries older than
///   the oldest of the newest `keep` that no kept entry builds on (the deltas merged deltas
///   skip), with their payloads: what a kept entry builds on is found by following each kept
///   entry's parents while they are older than the oldest kept one, each entry visited once.
///   Returns how many entries went.
/// - `drop_missing(index, ids, cp_prefix)` removes the entries among `ids` whose payload does
///   not exist (it expired); returns how many went.
/// - `drop_expired_oldest(index, budget, cp_prefix)` removes the oldest entries whose payload
///   does not exist, up to `budget`, stopping at the first whose payload exists (or that is not
///   an id); returns how many went.
pub(crate) const HELPERS: &str = r#"
local function is_id(text)
  return type(text) == 'string' and #text == 36
    and string.match(text, '^%x+%-%x+%-%x+%-%x+%-%x+$') ~= nil
end
local function cp_links(key)
  local head = redis.pcall('GETRANGE', key, 0, 132)
  if type(head) == 'string' then
    if string.sub(head, 1, 4) ~= 'rvc1' then return nil end
    local run = string.sub(head, 6, 41)
    if string.sub(head, 5, 5) == 'd' then
      return run, string.sub(head, 62, 97), string.sub(head, 98, 133)
    end
    return run, nil, nil
  end
  local fields = redis.pcall('HMGET', key, 'run', 'base', 'parent')
  if type(fields) == 'table' and fields.err == nil then
    return fields[1], fields[2], fields[3]
  end
  return nil
end
local function unlink_all(keys)
  for i = 1, #keys, 500 do
    redis.call('UNLINK', unpack(keys, i, math.min(i + 499, #keys)))
  end
end
local function prune_oldest(index, excess, budget, cp_prefix, seq_prefix, spare)
  if excess <= 0 then return 0 end
  local count = excess
  local kept = redis.call('ZRANGE', index, count, count)
  if #kept == 1 and is_id(kept[1]) then
    local _, base = cp_links(cp_prefix .. kept[1])
    if is_id(base) then
      local rank = redis.call('ZRANK', index, base)
      if rank and rank < count then count = rank end
    end
  end
  count = math.min(count, budget)
  if count <= 0 then return 0 end
  local doomed = redis.call('ZRANGE', index, 0, count - 1)
  if #doomed == 0 then return 0 end
  local payloads = {}
  local runs = {}
  for _, id in ipairs(doomed) do
    if is_id(id) then
      local key = cp_prefix .. id
      payloads[#payloads + 1] = key
      local run = cp_links(key)
      if is_id(run) and run ~= spare then runs[run] = true end
    end
  end
  redis.call('ZREMRANGEBYRANK', index, 0, #doomed - 1)
  unlink_all(payloads)
  local sequences = {}
  for run in pairs(runs) do sequences[#sequences + 1] = seq_prefix .. run end
  unlink_all(sequences)
  return #doomed
end
local function prune_skipped(index, keep, budget, cp_prefix)
  local excess = redis.call('ZCARD', index) - keep
  if excess <= 0 or budget <= 0 then return 0 end
  local kept = redis.call('ZRANGE', index, excess, -1)
  local oldest = kept[1]
  if not is_id(oldest) then return 0 end
  local needed = {}
  for _, k in ipairs(kept) do
    if is_id(k) then
      local _, _, up = cp_links(cp_prefix .. k)
      while is_id(up) and up < oldest and not needed[up] do
        needed[up] = true
        local _, _, above = cp_links(cp_prefix .. up)
        up = above
      end
    end
  end
  local doomed = {}
  local start = 0
  while #doomed < budget and start < excess do
    local page = redis.call('ZRANGE', index, start, math.min(start + 999, excess - 1))
    if #page == 0 then break end
    for _, id in ipairs(page) do
      if #doomed < budget and is_id(id) and not needed[id] then doomed[#doomed + 1] = id end
    end
    start = start + #page
  end
  if #doomed == 0 then return 0 end
  local payloads = {}
  for i, id in ipairs(doomed) do payloads[i] = cp_prefix .. id end
  for i = 1, #doomed, 500 do
    redis.call('ZREM', index, unpack(doomed, i, math.min(i + 499, #doomed)))
  end
  unlink_all(payloads)
  return #doomed
end
local function drop_missing(index, ids, cp_prefix)
  local dropped = 0
  for _, id in ipairs(ids) do
    if is_id(id) and redis.call('EXISTS', cp_prefix .. id) == 0 then
      dropped = dropped + redis.call('ZREM', index, id)
    end
  end
  return dropped
end
local function drop_expired_oldest(index, budget, cp_prefix)
  local dropped = 0
  local batch = math.min(budget, 16)
  while dropped < budget do
    local oldest = redis.call('ZRANGE', index, 0, batch - 1)
    if #oldest == 0 then return dropped end
    for _, id in ipairs(oldest) do
      if dropped >= budget or not is_id(id) or redis.call('EXISTS', cp_prefix .. id) == 1 then
        return dropped
      end
      redis.call('ZREM', index, id)
      dropped = dropped + 1
    end
  end
  return dropped
end
"#;

/// Writes one checkpoint if its sequence is newer than the run's stored one, then prunes the
/// thread to its newest `keep` checkpoints. Prepended with the fence check and [`HELPERS`].
///
/// A delta (a base id given) is written only while its base and parent are stored (its value's
/// header names both). When the base has less than half its TTL left, the chain (from the
/// parent back to the base, by the parents the headers name) gets the full TTL again, so a
/// chain lives as long as its newest delta. That is what a restore of the newest delta reads:
/// the deltas a merged delta skips (the steps before a merge point) keep the TTL they were
/// written with.
///
/// The thread's freshness key spares most writes of a chain two questions. A write that reads
/// the base's TTL sets it, naming the base, to expire when the base is down to half its TTL
/// (the base expires first of its chain: each delta was written after it, or had its TTL
/// renewed with it), and only once the index's oldest entry is that base (or the thread keeps
/// every checkpoint). While the key names the base, a write needs neither the base's TTL (one
/// call finds the base and the parent stored) nor the index's oldest entry: what it keeps
/// builds on that base, the oldest entry, so retention has nothing to let go (an id that sorts
/// before the base, from a clock running behind, still asks).
///
/// Nothing is written before every check passed (a script is not rolled back): a key of another
/// type is found by the calls that need it anyway (the fence counter, the sequence and the
/// freshness key are read in one `MGET`, and only a key it found missing is asked its type; a
/// freshness key of another type reads as missing and is replaced; the index entry is added
/// first of the writes, by a `pcall` that answers an index of another type), and the payload
/// key is set whatever it held. A fenced delta in the middle of a run's chain makes six calls.
///
/// KEYS: payload string, index zset, sequence string, the thread's fence counter, the thread's
/// freshness key. ARGV: checkpoint id, run id, sequence (decimal, no leading zeros), the value
/// (header and payload, see `encode_value`), TTL in ms, fencing token (empty: unfenced), how
/// many checkpoints the thread keeps (empty: all), the thread's checkpoint key prefix, its
/// sequence key prefix, the most one write may prune, the base id and the parent id (both
/// empty: a whole snapshot).
/// Returns `{"ok"}`, `{"fenced", current}`, `{"stale", stored}`, `{"missing", id}`,
/// `{"wrongtype", key}` or `{"corrupt", key}`.
pub(crate) const PUT: &str = r#"
-- One read for the fence counter, the run's sequence and the freshness key. MGET answers a key
-- of another type as it answers a missing one, so only a key found missing is asked its type.
local read = redis.call('MGET', KEYS[4], KEYS[3], KEYS[5])
local current, stored, fresh = read[1], read[2], read[3]
if not current and redis.call('TYPE', KEYS[4])['ok'] ~= 'none' then
  return {'wrongtype', KEYS[4]}
end
if not stored and redis.call('TYPE', KEYS[3])['ok'] ~= 'none' then
  return {'wrongtype', KEYS[3]}
end
local refused = fence_judged(KEYS[4], ARGV[6], ARGV[5], current)
if refused then return {'fenced', refused} end
if stored then
  if not (stored == '0' or string.match(stored, '^[1-9]%d*$')) or #stored > 20 then
    return {'corrupt', KEYS[3]}
  end
  local seq = ARGV[3]
  if #seq < #stored or (#seq == #stored and seq <= stored) then
    return {'stale', stored}
  end
end
local base, parent = ARGV[11], ARGV[12]
local ttl = tonumber(ARGV[5])
local keep = tonumber(ARGV[7])
local vouched = base ~= '' and fresh == base
-- The base's TTL, when it was read (nil: the freshness key vouched for it).
local left = nil
if base ~= '' then
  if not is_id(base) then return {'missing', base} end
  if parent ~= base and not is_id(parent) then return {'missing', parent} end
  local base_key, parent_key = ARGV[8] .. base, ARGV[8] .. parent
  if vouched then
    if redis.call('EXISTS', base_key, parent_key) < 2 then
      if redis.call('EXISTS', base_key) == 0 then return {'missing', base} end
      return {'missing', parent}
    end
  else
    left = redis.call('PTTL', base_key)
    if left == -2 then return {'missing', base} end
    if parent ~= base and redis.call('EXISTS', parent_key) == 0 then
      return {'missing', parent}
    end
  end
end
-- The score as text: a Lua number is formatted with sprintf on every call.
local added = redis.pcall('ZADD', KEYS[2], '0', ARGV[1])
if failed(added) then return {'wrongtype', KEYS[2]} end
redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[5])
if left and left >= 0 and left < ttl / 2 then
  local at = parent
  for _ = 1, 100000 do
    redis.call('PEXPIRE', ARGV[8] .. at, ttl)
    if at == base then break end
    local _, _, up = cp_links(ARGV[8] .. at)
    if not is_id(up) then break end
    at = up
  end
  left = ttl
end
redis.call('PEXPIRE', KEYS[2], ARGV[5])
redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[5])
-- What the thread keeps builds on this write's base or on an older one: with that base the
-- index's oldest entry, nothing can go, and the index is not even counted.
if keep and not (vouched and ARGV[1] > base) then
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if base == '' or oldest ~= base then
    local entries = redis.call('ZCARD', KEYS[2])
    if entries > keep then
      prune_oldest(KEYS[2], entries - keep, tonumber(ARGV[10]), ARGV[8], ARGV[9], ARGV[2])
      if left then oldest = redis.call('ZRANGE', KEYS[2], 0, 0)[1] end
    end
  end
  -- Older entries than the base are still kept: the key does not vouch for the index yet.
  if oldest ~= base then left = nil end
end
if left then
  -- The base lives `left` longer (or, with no TTL, until it is given one): the key vouches
  -- for the chain until the base is down to half its TTL.
  local vouch = left - math.floor(ttl / 2)
  if left < 0 then vouch = math.floor(ttl / 2) end
  if vouch >= 1 then redis.call('SET', KEYS[5], base, 'PX', vouch) end
end
return {'ok'}
"#;

/// Trims a thread to its newest `keep` checkpoints and what they build on, at most `budget` of
/// them per call (the oldest first, then the deltas merged deltas skip); in the
/// call that reaches `keep`, also drops the oldest kept entries whose payload expired (up to
/// `budget`, stopping at the first that exists: payloads expire oldest first). Prepended with
/// [`HELPERS`].
///
/// KEYS: index zset, the thread's lease hash. ARGV: the thread's checkpoint key prefix, its
/// sequence key prefix, keep, budget.
/// Returns `{"ok", entries before, entries pruned, expired entries dropped}` or
/// `{"wrongtype", key}`.
pub(crate) const TRIM: &str = r#"
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' and t ~= 'zset' then return {'wrongtype', KEYS[1]} end
local n = redis.call('ZCARD', KEYS[1])
local keep = tonumber(ARGV[3])
local budget = tonumber(ARGV[4])
local spare = ''
if redis.call('TYPE', KEYS[2])['ok'] == 'hash' then
  spare = redis.call('HGET', KEYS[2], 'run') or ''
end
local pruned = 0
if n > keep then
  pruned = prune_oldest(KEYS[1], n - keep, budget, ARGV[1], ARGV[2], spare)
  pruned = pruned + prune_skipped(KEYS[1], keep, budget - pruned, ARGV[1])
end
local dropped = 0
if n - pruned <= keep and n - pruned > 0 then
  dropped = drop_expired_oldest(KEYS[1], budget, ARGV[1])
end
return {'ok', n, pruned, dropped}
"#;

/// Removes a thread's entries that its retention no longer keeps and no kept entry builds on,
/// though older ones are kept (the deltas merged deltas skip), at most `budget` per call.
/// Prepended with [`HELPERS`].
///
/// KEYS: index zset. ARGV: the thread's checkpoint key prefix, keep, budget.
/// Returns `{"ok", entries removed}` or `{"wrongtype", key}`.
pub(crate) const SKIPPED: &str = r#"
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then return {'ok', 0} end
if t ~= 'zset' then return {'wrongtype', KEYS[1]} end
return {'ok', prune_skipped(KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[1])}
"#;

/// Counts a thread's checkpoints: drops the oldest entries whose payload expired (up to
/// `budget`, stopping at the first that exists), then answers the index's size. Prepended
/// with [`HELPERS`].
///
/// KEYS: index zset. ARGV: the thread's checkpoint key prefix, budget.
/// Returns `{"ok", count, dropped}` or `{"wrongtype", key}`.
pub(crate) const COUNT: &str = r#"
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then return {'ok', 0, 0} end
if t ~= 'zset' then return {'wrongtype', KEYS[1]} end
local dropped = drop_expired_oldest(KEYS[1], tonumber(ARGV[2]), ARGV[1])
return {'ok', redis.call('ZCARD', KEYS[1]), dropped}
"#;

/// Lists a window of the index: the entries from rank `start`, at most `count`, without those
/// whose payload expired (which it removes). Prepended with [`HELPERS`].
///
/// KEYS: index zset. ARGV: the thread's checkpoint key prefix, start, count.
/// Returns `{"ok", entries seen, {ids of existing checkpoints}}` or `{"wrongtype", key}`.
pub(crate) const LIST: &str = r#"
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then return {'ok', 0, {}} end
if t ~= 'zset' then return {'wrongtype', KEYS[1]} end
local start = tonumber(ARGV[2])
local seen = redis.call('ZRANGE', KEYS[1], start, start + tonumber(ARGV[3]) - 1)
local live = {}
local gone = {}
for _, id in ipairs(seen) do
  if is_id(id) and redis.call('EXISTS', ARGV[1] .. id) == 0 then
    gone[#gone + 1] = id
  else
    live[#live + 1] = id
  end
end
drop_missing(KEYS[1], gone, ARGV[1])
return {'ok', #seen, live}
"#;

/// Drops the given index entries whose payload does not exist (checked again here, so an entry
/// written since the caller looked stays). Prepended with [`HELPERS`].
///
/// KEYS: index zset. ARGV: the thread's checkpoint key prefix, then the ids.
/// Returns how many entries went.
pub(crate) const DROP: &str = r#"
if redis.call('TYPE', KEYS[1])['ok'] ~= 'zset' then return 0 end
local ids = {}
for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
return drop_missing(KEYS[1], ids, ARGV[1])
"#;

/// Reads what a delta builds on at once: the checkpoint at `KEYS[1]`, then the parent its
/// value's header names (a hash's `parent` field, as earlier releases wrote it), and so on,
/// up to and including the first whole snapshot, at most `max`; it stops at a key that does
/// not exist, or at a parent that is not an id (which never becomes a key name, so the script
/// stays in the thread's slot). Each value takes one call: a `GET`, which answers a hash (or a
/// key of another type) with an error, and only then is the key asked its type.
///
/// KEYS: the first checkpoint's key. ARGV: the thread's checkpoint key prefix, the first
/// checkpoint's id, max.
/// Returns `{"ok", id, value or {hash fields and values}, id, …}`, newest first, or
/// `{"wrongtype", key}`.
pub(crate) const CHAIN: &str = r#"
local out = {'ok'}
local id, key = ARGV[2], KEYS[1]
for _ = 1, tonumber(ARGV[3]) do
  local value = redis.pcall('GET', key)
  local parent = nil
  if type(value) == 'table' then
    if redis.call('TYPE', key)['ok'] ~= 'hash' then return {'wrongtype', key} end
    value = redis.call('HGETALL', key)
    for i = 1, #value - 1, 2 do
      if value[i] == 'parent' then parent = value[i + 1] end
    end
  elseif value and string.sub(value, 1, 5) == 'rvc1d' then
    parent = string.sub(value, 98, 133)
  end
  if not value then break end
  out[#out + 1] = id
  out[#out + 1] = value
  if type(parent) ~= 'string' or #parent ~= 36
    or not string.match(parent, '^%x+%-%x+%-%x+%-%x+%-%x+$') then
    break
  end
  id, key = parent, ARGV[1] .. parent
end
return out
"#;

/// Reads one checkpoint, with one call unless it is not a string (as for [`CHAIN`]).
///
/// KEYS: its key.
/// Returns `{"value", value}`, `{"hash", {fields and values}}` (as earlier releases wrote
/// it), `{"none"}` or `{"wrongtype", key}`.
pub(crate) const READ: &str = r#"
local value = redis.pcall('GET', KEYS[1])
if type(value) == 'string' then return {'value', value} end
if not value then return {'none'} end
if redis.call('TYPE', KEYS[1])['ok'] == 'hash' then
  return {'hash', redis.call('HGETALL', KEYS[1])}
end
return {'wrongtype', KEYS[1]}
"#;
