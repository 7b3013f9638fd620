#!/usr/bin/env python3
"""A workflow whose nodes are served by Python, run through `runvisor serve`, stopped
mid-stream and resumed: standard library only.

    runvisor serve &                      # listens on 127.0.0.1:8080
    python3 examples/clients/python/demo.py --url http://127.0.0.1:8080 [--mode force]

The script serves three `http` nodes on a free loopback port (runvisor's default allow-list
is loopback): `plan` answers JSON, `answer` streams its words slowly as NDJSON, `review`
checks the answer it is given. It starts the workflow with `stream: true`, prints its events,
stops the run once `answer` has streamed two chunks (`--mode graceful`, the default: the call
finishes within the stop's timeout and is kept whole; `--mode force`: the connection is
dropped and the streamed words are kept as partial text), checks the stop result, resumes the
thread and checks that it finishes with the expected outputs. Any mismatch exits 1 with an
`error:` line.
"""

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from runvisor_client import ApiError, Client

ANSWER = "A stop never loses work: what was streamed is kept, and a resume goes on."
WORDS = [word if i == 0 else " " + word for i, word in enumerate(ANSWER.split(" "))]
STOP_AFTER_CHUNKS = 2


class Failed(Exception):
    """A check that did not hold."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise Failed(message)


class Host:
    """What the node handlers saw, shared with the script."""

    def __init__(self, delay: float):
        self.delay = delay
        self.lock = threading.Lock()
        self.calls = []  # (node, request body)
        self.answers = []  # per `answer` call: {"sent": n, "disconnected": bool, "done": bool}

    def record(self, node: str, body: dict) -> None:
        with self.lock:
            self.calls.append((node, body))


def handler_for(host: Host):
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0: a streamed body ends when the connection closes.
        protocol_version = "HTTP/1.0"

        def log_message(self, *args):  # quiet
            pass

        def do_POST(self):
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            node = self.path.strip("/")
            for field in ("input", "run_id", "thread", "node", "path", "attempt"):
                if field not in body:
                    return self.reply(400, {"error": f"the request has no `{field}`"})
            host.record(node, body)
            if node == "plan":
                question = body["input"].get("question", "")
                return self.reply(200, {"topic": "stops", "question": question})
            if node == "answer":
                return self.stream_answer()
            if node == "review":
                text = body["input"].get("text", "")
                verdict = "complete" if text == ANSWER else "cut"
                return self.reply(200, {"verdict": verdict, "length": len(text)})
            self.reply(404, {"error": f"no node {node}"})

        def reply(self, status: int, document: dict) -> None:
            data = json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def stream_answer(self) -> None:
            state = {"sent": 0, "disconnected": False, "done": False}
            with host.lock:
                host.answers.append(state)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.end_headers()
            try:
                for i, word in enumerate(WORDS):
                    if i > 0:
                        time.sleep(host.delay)
                    self.wfile.write((json.dumps({"text": word}) + "\n").encode())
                    self.wfile.flush()
                    state["sent"] += 1
                final = {"output": {"words": len(WORDS)}, "usage": {"host_calls": 1}}
                self.wfile.write((json.dumps(final) + "\n").encode())
                self.wfile.flush()
                state["done"] = True
            except (BrokenPipeError, ConnectionResetError):
                state["disconnected"] = True

    return Handler


def workflow(base: str) -> dict:
    node = lambda id, params: {"id": id, "kind": "http", "params": params}  # noqa: E731
    return {
        "id": "python-hosted",
        "nodes": [
            {"id": "start", "kind": "begin"},
            node("plan", {"url": f"{base}/plan", "input": {"question": "{{sys.query}}"}}),
            node("answer", {"url": f"{base}/answer", "input": {"topic": "{{plan.topic}}"},
                            "timeout": "1m", "append_message": True}),
            node("review", {"url": f"{base}/review", "input": {"text": "{{answer.text}}"},
                            "retry": {"attempts": 3, "backoff": "100ms"}}),
        ],
        "edges": [
            {"from": "start", "to": "plan"},
            {"from": "plan", "to": "answer"},
            {"from": "answer", "to": "review"},
        ],
    }


def show(event) -> None:
    data = event.data
    if event.name == "node_chunk":
        print(f"  chunk  {data['path']}: {data['text']!r}")
    elif event.name in ("node_started", "node_finished", "node_interrupted", "node_failed",
                        "stopping", "run_started"):
        brief = {k: v for k, v in data.items() if k != "output"}
        print(f"  {event.name}  {json.dumps(brief)}")
    else:
        print(f"  {event.name}  status={data.get('status') if isinstance(data, dict) else data}")


def demo(client: Client, host: Host, base: str, mode: str) -> None:
    chunks = []
    stop_reply = {}
    stopper = None
    run_id = thread = None
    last = None
    print(f"start: streaming a run of {len(WORDS)} words; {mode} stop after {STOP_AFTER_CHUNKS}")
    for event in client.stream_run(workflow(base), inputs={"query": "How do stops work?"}):
        show(event)
        last = event
        if event.name == "run_started":
            run_id, thread = event.data["run_id"], event.data["thread"]
        elif event.name == "node_chunk" and event.data["path"] == "answer":
            chunks.append(event.data["text"])
            if len(chunks) == STOP_AFTER_CHUNKS and stopper is None:
                # The stop answers once the run has stopped: meanwhile the events go on.
                def stop():
                    timeout = "30s" if mode == "graceful" else None
                    stop_reply.update(client.stop_run(run_id, mode=mode, timeout=timeout))
                stopper = threading.Thread(target=stop)
                stopper.start()
    check(run_id is not None, "no run_started event")
    check(stopper is not None, f"the stream ended before {STOP_AFTER_CHUNKS} chunks")
    stopper.join(60)
    check(last is not None and last.name == "stopped",
          f"the stream should end with `stopped`, not {last and last.name}")
    outcome = last.data
    stop = outcome.get("stop") or {}
    check(outcome.get("status") == "stopped", f"status {outcome.get('status')!r}")
    check(stop_reply.get("stop") == stop,
          "the stop request's answer and the stream's outcome differ")
    streamed = "".join(chunks)
    if mode == "graceful":
        check(streamed == ANSWER, f"graceful: streamed {streamed!r}, not the whole answer")
        check(stop.get("partial_response") is None, f"graceful: partial {stop}")
        check(stop.get("forced") == [], f"graceful: forced {stop.get('forced')}")
        check("answer" in stop.get("finished", []), f"graceful: finished {stop}")
        check(stop.get("frontier") == ["review"], f"graceful: frontier {stop.get('frontier')}")
        check(outcome["outputs"].get("answer", {}).get("text") == ANSWER,
              f"graceful: answer output {outcome['outputs'].get('answer')}")
        print(f"ok: graceful stop kept the whole answer ({len(chunks)} chunks) and stops "
              f"before {stop['frontier']}")
    else:
        partial = stop.get("partial_response") or ""
        check(stop.get("forced") == ["answer"], f"force: forced {stop.get('forced')}")
        check(partial and ANSWER.startswith(partial) and partial != ANSWER,
              f"force: partial_response {partial!r} is not a cut answer")
        check(streamed.startswith(partial), f"force: streamed {streamed!r}, kept {partial!r}")
        check("answer" in stop.get("frontier", []), f"force: frontier {stop.get('frontier')}")
        print(f"ok: force stop kept the partial text {partial!r} and will rerun "
              f"{stop['frontier']}")

    run = client.get_run(run_id)
    check(run.get("status") == "stopped", f"GET /v1/runs/{run_id}: status {run.get('status')}")
    print(f"ok: GET /v1/runs/{run_id} says stopped")

    print(f"resume: thread {thread}")
    last = None
    for event in client.stream_resume(thread):
        show(event)
        last = event
    check(last is not None and last.name == "finished",
          f"the resumed run should end `finished`, not {last and last.name}")
    outcome = last.data
    outputs = outcome.get("outputs", {})
    check(outcome.get("status") == "succeeded", f"resumed status {outcome.get('status')!r}")
    check(outputs.get("review", {}).get("verdict") == "complete",
          f"review output {outputs.get('review')}")
    check(outputs.get("answer", {}).get("text") == ANSWER,
          f"answer output {outputs.get('answer')}")
    print("ok: the resumed run completed; review saw the whole answer")

    answers = host.answers
    if mode == "graceful":
        check(len(answers) == 1 and answers[0]["done"],
              f"graceful: the answer should be served once, whole: {answers}")
    else:
        # The dropped connection shows on the host's next write.
        deadline = time.monotonic() + 30
        while not answers[0]["disconnected"] and time.monotonic() < deadline:
            time.sleep(0.05)
        check(answers[0]["disconnected"], f"force: the host never saw the disconnect: {answers}")
        check(len(answers) == 2 and answers[1]["done"],
              f"force: the answer should be served again, whole, on resume: {answers}")
        print(f"ok: the host saw the connection dropped after {answers[0]['sent']} chunks")
    paths = sorted({body["path"] for _, body in host.calls})
    check(paths == ["answer", "plan", "review"], f"paths seen by the host: {paths}")
    print("ok: every request carried its run, thread, node, path and attempt")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080",
                        help="the runvisor serve to talk to")
    parser.add_argument("--token", help="the bearer token, if the service requires one")
    parser.add_argument("--mode", choices=["graceful", "force"], default="graceful",
                        help="how to stop the run mid-stream")
    parser.add_argument("--delay", type=float, default=0.1,
                        help="seconds between two streamed words")
    args = parser.parse_args()

    host = Host(args.delay)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(host))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    print(f"host: serving the nodes on {base}")
    try:
        demo(Client(args.url, token=args.token), host, base, args.mode)
    except Failed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except ApiError as e:
        print(f"error: runvisor answered {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: cannot talk to runvisor serve at {args.url}: {e}", file=sys.stderr)
        return 1
    finally:
        server.shutdown()
    print(f"demo passed ({args.mode} stop)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
