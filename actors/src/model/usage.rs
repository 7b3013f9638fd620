//! Usage: amounts a run's nodes consumed (tokens, calls, credits), summed per run.

/// Amounts consumed, by name (`tokens`, `calls`, ...).
pub type Usage = std::collections::BTreeMap<String, f64>;

/// Adds `more` to `total`.
pub(crate) fn add_usage(total: &mut Usage, more: &Usage) {
    for (name, amount) in more {
        *total.entry(name.clone()).or_insert(0.0) += amount;
    }
}
