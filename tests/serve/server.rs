//! A `runvisor serve` process for tests: started on a free loopback port (`--listen
//! 127.0.0.1:0`, the address read from its first line), spoken to over HTTP, stopped with
//! SIGTERM. Shared by the `serve` tests and the Redis tests (through `#[path]`).

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_runvisor");

/// How long a test waits for anything (the server to listen, a run to reach a node, ...)
/// before it fails: a bound against hanging, never a timing assertion.
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

/// A running `runvisor serve`.
pub(crate) struct Server {
    child: Child,
    pub(crate) address: SocketAddr,
    log: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
    client: reqwest::Client,
    token: Option<String>,
}

/// An HTTP answer: its status and JSON body.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Value,
}

impl Answer {
    /// The error code of an error answer.
    pub(crate) fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

impl Server {
    /// Starts `runvisor [global...] serve --listen 127.0.0.1:0 [extra...]`.
    pub(crate) fn start(global: &[&str], extra: &[&str]) -> Self {
        Self::start_with_env(global, extra, &[])
    }

    /// Starts `runvisor [global...] serve --listen 127.0.0.1:0 [extra...]` with these
    /// environment variables set.
    pub(crate) fn start_with_env(global: &[&str], extra: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(BIN)
            .args(global)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(extra)
            .env_remove("RUST_LOG")
            .env_remove("RUNVISOR_REDIS_URL")
            .env_remove("RUNVISOR_TOKEN")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn runvisor serve");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let lines = Arc::clone(&log);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on http://").nth(1)
                    && let Some(addr) = rest.split_whitespace().next()
                {
                    let _ = tx.send(addr.to_owned());
                }
                let mut log = lines.lock().unwrap_or_else(|e| e.into_inner());
                log.push_str(&line);
                log.push('\n');
            }
        });
        let address = match rx.recv_timeout(PATIENCE) {
            Ok(addr) => addr.parse().expect("a socket address"),
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "runvisor serve did not listen: {}",
                    log.lock().expect("log")
                );
            }
        };
        Self {
            child,
            address,
            log,
            reader: Some(reader),
            client: reqwest::Client::new(),
            token: None,
        }
    }

    /// Sends this token with every request from now on.
    pub(crate) fn with_token(mut self, token: &str) -> Self {
        self.token = Some(token.to_owned());
        self
    }

    /// What the server wrote to stderr so far.
    pub(crate) fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Answer {
        let request = match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        let response = request.send().await.expect("the server answers");
        let status = response.status().as_u16();
        let text = response.text().await.expect("a body");
        let body = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("a JSON body ({e}), got {status}: {text:?}"));
        Answer { status, body }
    }

    /// `GET path`, answered as text: its status, content type and body.
    pub(crate) async fn get_text(&self, path: &str) -> (u16, String, String) {
        let request = self.client.get(self.url(path));
        let request = match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        let response = request.send().await.expect("the server answers");
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        (status, content_type, response.text().await.expect("a body"))
    }

    pub(crate) async fn get(&self, path: &str) -> Answer {
        self.send(self.client.get(self.url(path))).await
    }

    /// POSTs `body` as JSON with these headers.
    pub(crate) async fn post_with(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: Value,
    ) -> Answer {
        let mut request = self.client.post(self.url(path)).json(&body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        self.send(request).await
    }

    /// POSTs `body` as JSON.
    pub(crate) async fn post(&self, path: &str, body: Value) -> Answer {
        self.send(self.client.post(self.url(path)).json(&body))
            .await
    }

    /// Starts a run (`POST /v1/runs` with `body`, not waiting); returns its id.
    pub(crate) async fn start_run(&self, body: Value) -> String {
        let started = self.post("/v1/runs", body).await;
        assert_eq!(started.status, 202, "{started:?}");
        started.body["run_id"]
            .as_str()
            .expect("a run id")
            .to_owned()
    }

    /// POSTs raw bytes with a content type.
    pub(crate) async fn post_raw(
        &self,
        path: &str,
        content_type: Option<&str>,
        body: impl Into<reqwest::Body>,
    ) -> Answer {
        let mut request = self.client.post(self.url(path)).body(body);
        if let Some(ct) = content_type {
            request = request.header("content-type", ct);
        }
        self.send(request).await
    }

    /// Polls `GET path` until `check` holds for the answer.
    pub(crate) async fn until(
        &self,
        what: &str,
        path: &str,
        check: impl Fn(&Answer) -> bool,
    ) -> Answer {
        let poll = async {
            loop {
                let answer = self.get(path).await;
                if check(&answer) {
                    return answer;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        match tokio::time::timeout(PATIENCE, poll).await {
            Ok(answer) => answer,
            Err(_) => panic!("waited too long for {what}; server log:\n{}", self.log()),
        }
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub(crate) fn terminate(mut self) -> (ExitStatus, String) {
        let pid = i32::try_from(self.child.id()).expect("a pid");
        // SAFETY: kill(2) on the pid of a child we own and have not reaped.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let status = self.child.wait().expect("the server exits");
        // Its stderr closed with it: the reader has the last lines once it ends.
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        (status, self.log())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
