"""A client for the native API of `runvisor serve`, on the Python standard library only.

    from runvisor_client import Client

    client = Client("http://127.0.0.1:8080")
    for event in client.stream_run(workflow, inputs={"query": "hi"}):
        print(event.name, event.data)          # run_started, node_chunk, ..., finished

    run = client.start_run(workflow)            # {"run_id": ..., "thread": ..., ...}
    client.get_run(run["run_id"])
    client.stop_run(run["run_id"], mode="graceful", timeout="5s")   # the outcome, with `stop`
    client.resume_thread(run["thread"], wait=True)                  # continues where it stopped

Every error answer of the service becomes an `ApiError` carrying its HTTP status and its
stable `code` (`thread_busy`, `no_live_run`, `invalid_workflow`, ...).
"""

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional


class ApiError(Exception):
    """An error answer: its HTTP status, stable code, message and whole JSON body."""

    def __init__(self, status: int, code: str, message: str, body: Any):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.body = body


@dataclass
class Event:
    """One server-sent event of a streamed run: its name and its JSON data."""

    name: str
    data: Any


class Client:
    """The native API (`/v1/...`) of one `runvisor serve`."""

    def __init__(self, base_url: str, token: Optional[str] = None, timeout: float = 60.0):
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout

    # Runs

    def start_run(self, workflow: Any, inputs: Optional[Dict[str, Any]] = None,
                  wait: bool = False, **labels: Optional[str]) -> Dict[str, Any]:
        """Starts a run (`POST /v1/runs`). Answers the run, its thread and links at once, or
        its outcome with `wait=True`. `labels`: `thread`, `app`, `chat`, `task`, `user`."""
        return self._json("POST", "/v1/runs", self._start_body(workflow, inputs, labels, wait))

    def stream_run(self, workflow: Any, inputs: Optional[Dict[str, Any]] = None,
                   **labels: Optional[str]) -> Iterator[Event]:
        """Starts a run and yields its events as they come; the last one is the outcome
        (`finished`, `paused` or `stopped`)."""
        body = self._start_body(workflow, inputs, labels, False)
        body["stream"] = True
        return self._events("POST", "/v1/runs", body)

    def get_run(self, run_id: str) -> Dict[str, Any]:
        """A run (`GET /v1/runs/{run_id}`), with its outcome while the service keeps it."""
        return self._json("GET", f"/v1/runs/{_quote(run_id)}")

    def list_runs(self, **filters: Any) -> Dict[str, Any]:
        """Runs across all workers (`GET /v1/runs`): `status`, `app`, `user`, `thread`,
        `worker`, `limit`, ... as the API takes them."""
        query = urllib.parse.urlencode({k: v for k, v in filters.items() if v is not None})
        return self._json("GET", "/v1/runs" + (f"?{query}" if query else ""))

    def stop_run(self, run_id: str, mode: str = "graceful",
                 timeout: Optional[str] = None) -> Dict[str, Any]:
        """Stops a run (`POST /v1/runs/{run_id}/stop`): `graceful` (running nodes may finish
        within `timeout`, e.g. `"5s"`) or `force`. Answers the stopped run's outcome; its
        `stop` field is the stop result."""
        body: Dict[str, Any] = {"mode": mode}
        if timeout is not None:
            body["timeout"] = timeout
        return self._json("POST", f"/v1/runs/{_quote(run_id)}/stop", body)

    def cancel_run(self, run_id: str) -> Dict[str, Any]:
        """Cancels a run (`POST /v1/runs/{run_id}/cancel`); it stays resumable."""
        return self._json("POST", f"/v1/runs/{_quote(run_id)}/cancel", {})

    # Threads

    def resume_thread(self, thread: str, wait: bool = False, **fields: Any) -> Dict[str, Any]:
        """Resumes a thread (`POST /v1/threads/{thread}/resume`) from its newest checkpoint;
        `fields`: `say` (a new instruction), `answer` and `interaction` (an interaction's
        answer), `checkpoint` and `fork_into` (a fork)."""
        body = {k: v for k, v in fields.items() if v is not None}
        body["wait"] = wait
        return self._json("POST", f"/v1/threads/{_quote(thread)}/resume", body)

    def stream_resume(self, thread: str, **fields: Any) -> Iterator[Event]:
        """Resumes a thread and yields the new run's events, then its outcome."""
        body = {k: v for k, v in fields.items() if v is not None}
        body["stream"] = True
        return self._events("POST", f"/v1/threads/{_quote(thread)}/resume", body)

    def checkpoints(self, thread: str) -> Dict[str, Any]:
        """A thread's checkpoints (`GET /v1/threads/{thread}/checkpoints`)."""
        return self._json("GET", f"/v1/threads/{_quote(thread)}/checkpoints")

    def validate(self, workflow: Any) -> Dict[str, Any]:
        """Validates a workflow (`POST /v1/workflows/validate`)."""
        return self._json("POST", "/v1/workflows/validate", {"workflow": workflow})

    # Plumbing

    @staticmethod
    def _start_body(workflow: Any, inputs: Optional[Dict[str, Any]],
                    labels: Dict[str, Optional[str]], wait: bool) -> Dict[str, Any]:
        known = {"thread", "app", "chat", "task", "user"}
        unknown = set(labels) - known
        if unknown:
            raise TypeError(f"unknown run labels: {', '.join(sorted(unknown))}")
        body: Dict[str, Any] = {"workflow": workflow, "inputs": inputs or {}, "wait": wait}
        body.update({k: v for k, v in labels.items() if v is not None})
        return body

    def _request(self, method: str, path: str, body: Any = None) -> urllib.request.Request:
        headers = {"Accept": "application/json, text/event-stream"}
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return urllib.request.Request(self.base_url + path, data=data, headers=headers,
                                      method=method)

    def _open(self, request: urllib.request.Request):
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                body = json.loads(raw)
                error = body.get("error", {}) if isinstance(body, dict) else {}
                code, message = error.get("code", "unknown"), error.get("message", "")
            except ValueError:
                body, code, message = raw.decode("utf-8", "replace"), "unknown", ""
            raise ApiError(e.code, code, message or str(body), body) from None

    def _json(self, method: str, path: str, body: Any = None) -> Dict[str, Any]:
        with self._open(self._request(method, path, body)) as response:
            return json.loads(response.read())

    def _events(self, method: str, path: str, body: Any) -> Iterator[Event]:
        response = self._open(self._request(method, path, body))
        with response:
            name, data = "message", []
            for raw in response:
                line = raw.decode("utf-8").rstrip("\r\n")
                if not line:
                    if data:
                        text = "\n".join(data)
                        try:
                            parsed = json.loads(text)
                        except ValueError:
                            parsed = text
                        yield Event(name, parsed)
                    name, data = "message", []
                elif line.startswith(":"):
                    continue
                else:
                    field, _, value = line.partition(":")
                    value = value[1:] if value.startswith(" ") else value
                    if field == "event":
                        name = value
                    elif field == "data":
                        data.append(value)


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")
