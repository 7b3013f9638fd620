//! The operator page in a real headless Chromium, driven over WebDriver (chromedriver): it
//! lists a running run, shows its actor tree with the loop's iteration, stops it with one
//! click and shows the stop result; with a token it asks for it once and then works.
//!
//! Chromium and chromedriver are needed (Debian's `chromium` and `chromium-driver`);
//! `bash .ci/run` installs them when they are missing. Without them these tests fail.

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use super::server::{PATIENCE, Server};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

/// How often a condition on the page is looked at again.
const POLL: Duration = Duration::from_millis(100);

/// A chromedriver on a free loopback port, in its own process group: dropping it kills the
/// group (chromedriver and the browsers it started).
struct Chromedriver {
    child: Child,
    port: u16,
}

impl Chromedriver {
    fn start() -> Self {
        for program in [CHROMEDRIVER, CHROMIUM] {
            assert!(
                Path::new(program).exists(),
                "{program} is missing: run `bash .ci/run`, which installs chromium and \
                 chromium-driver (or `apt-get install -y chromium chromium-driver`)"
            );
        }
        let port = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("spawn chromedriver");
        let driver = Self { child, port };
        let deadline = Instant::now() + PATIENCE;
        while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "chromedriver did not listen on port {port}"
            );
            std::thread::sleep(POLL);
        }
        driver
    }

    /// A headless Chromium session.
    async fn browser(&self) -> Client {
        let options = json!({
            "binary": CHROMIUM,
            "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        });
        let mut capabilities = serde_json::Map::new();
        capabilities.insert("goog:chromeOptions".into(), options);
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await
            .expect("a chromium session")
    }
}

impl Drop for Chromedriver {
    fn drop(&mut self) {
        if let Ok(group) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) on the process group of a child we started (its own group).
            unsafe {
                libc::kill(-group, libc::SIGKILL);
            }
        }
        let _ = self.child.wait();
    }
}

/// Waits until the text of the first element matching `css` satisfies `check`; returns it.
async fn until_text(
    browser: &Client,
    what: &str,
    css: &str,
    check: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + PATIENCE;
    let mut last = String::new();
    loop {
        if let Ok(element) = browser.find(Locator::Css(css)).await
            && let Ok(text) = element.text().await
        {
            if check(&text) {
                return text;
            }
            last = text;
        }
        if Instant::now() > deadline {
            let source = browser.source().await.unwrap_or_default();
            panic!("waited too long for {what} ({css}); last text {last:?}; page:\n{source}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Clicks the first element matching `css`.
async fn click(browser: &Client, css: &str) {
    let element = browser
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css}: {e}"));
    element
        .click()
        .await
        .unwrap_or_else(|e| panic!("{css} cannot be clicked: {e}"));
}

/// `start -> drafts (a loop over two topics whose body naps for a minute) -> done`.
fn napping_loop() -> Value {
    json!({"id": "napping", "nodes": [
        {"id": "start", "kind": "begin"},
        {"id": "drafts", "kind": "loop",
         "params": {"mode": "array", "items": ["tea", "coffee"], "output": "{{nap.slept}}"},
         "body": {"nodes": [{"id": "nap", "kind": "sleep", "params": {"duration": "60s"}}],
                  "edges": []}},
        {"id": "done", "kind": "message", "params": {"template": "done"}}
    ], "edges": [{"from": "start", "to": "drafts"}, {"from": "drafts", "to": "done"}]})
}

/// Starts the napping loop; returns its run id once it naps in the first iteration.
async fn napping(server: &Server, thread: &str) -> String {
    let run = server
        .start_run(
            json!({"workflow": napping_loop(), "thread": thread, "app": "app-1",
                          "chat": "chat-1", "user": "ada"}),
        )
        .await;
    server
        .until("the run to nap", &format!("/v1/runs/{run}"), |a| {
            a.body["nodes"]
                .as_array()
                .is_some_and(|nodes| nodes.contains(&json!("drafts/#0/nap")))
        })
        .await;
    run
}

#[tokio::test(flavor = "multi_thread")]
async fn the_page_shows_a_running_runs_tree_and_stops_it_with_one_click() {
    let driver = Chromedriver::start();
    let server = Server::start(&[], &[]);
    let run = napping(&server, "page-1").await;
    let browser = driver.browser().await;
    browser
        .goto(&server.url("/"))
        .await
        .expect("the page opens");

    let row = format!("tr[data-run='{run}']");
    until_text(
        &browser,
        "the run listed as running",
        &format!("{row} .status-cell"),
        |t| t == "running",
    )
    .await;
    let labels = until_text(
        &browser,
        "the run's labels",
        &format!("{row} td:nth-child(5)"),
        |t| !t.is_empty(),
    )
    .await;
    assert_eq!(labels, "app app-1, chat chat-1, user ada");
    let token_form = browser
        .find(Locator::Id("token-form"))
        .await
        .expect("the form");
    assert!(
        !token_form.is_displayed().await.expect("displayed or not"),
        "no token is configured: the page must not ask for one"
    );
    click(&browser, &format!("{row} button")).await;

    // The tree: the supervisor, the loop in its first iteration, the node napping in it.
    until_text(
        &browser,
        "the loop's iteration",
        "#tree li[data-kind='loop']",
        |t| t.contains("iteration #0"),
    )
    .await;
    until_text(
        &browser,
        "the napping node",
        "#tree li[data-node='nap']",
        |t| t.contains("drafts/#0/nap"),
    )
    .await;

    click(&browser, "#stop").await;
    let result = until_text(&browser, "the stop result", "#result .stop-result", |t| {
        t.contains("user_interrupted")
    })
    .await;
    assert!(result.contains("stopped"), "{result}");
    assert!(result.contains("Stopped at\ndrafts/#0/nap"), "{result}");
    assert!(result.contains("Finished\nstart"), "{result}");
    until_text(
        &browser,
        "the run listed as stopped",
        &format!("{row} .status-cell"),
        |t| t == "stopped",
    )
    .await;
    until_text(&browser, "no live actors", "#tree", |t| {
        t.contains("stopped")
    })
    .await;

    // What the page showed is what the API says.
    let stopped = server.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(stopped.body["status"], "stopped", "{stopped:?}");
    assert_eq!(
        stopped.body["outcome"]["stop"]["reason"],
        "user_interrupted"
    );

    // Resume (continue): a new run of the thread, napping in the first iteration again; a
    // force stop aborts it; resumed again, a cancel stops it with reason cancelled.
    let resumed = resume(&browser, &server).await;
    click(&browser, "#force").await;
    let forced = until_text(
        &browser,
        "the force stop's result",
        "#result .stop-result",
        |t| t.contains("Aborted (force)\nnap"),
    )
    .await;
    assert!(forced.contains("Reason\nuser_interrupted"), "{forced}");
    let stopped = server.get(&format!("/v1/runs/{resumed}")).await;
    assert_eq!(stopped.body["outcome"]["stop"]["forced"], json!(["nap"]));
    let resumed = resume(&browser, &server).await;
    click(&browser, "#cancel").await;
    let cancelled = until_text(
        &browser,
        "the cancel's result",
        "#result .stop-result",
        |t| t.contains("Reason\ncancelled"),
    )
    .await;
    assert!(
        cancelled.contains("Stopped at\ndrafts/#0/nap"),
        "{cancelled}"
    );
    let listed = server.get("/v1/runs?all=true&thread=page-1").await;
    let statuses: Vec<_> = listed.body["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| {
            (
                r["run_id"].as_str().unwrap_or("").to_owned(),
                r["status"].clone(),
            )
        })
        .collect();
    assert_eq!(statuses.len(), 3, "{listed:?}");
    assert!(
        statuses.contains(&(resumed, json!("cancelled"))),
        "{listed:?}"
    );
    browser.close().await.expect("the session closes");
}

/// Presses resume on the selected (ended) run; returns the new run's id once the page shows
/// it napping in the loop's first iteration.
async fn resume(browser: &Client, server: &Server) -> String {
    click(browser, "#resume").await;
    let said = until_text(browser, "the resumed run", "#result", |t| {
        t.starts_with("Resumed as run ")
    })
    .await;
    let run = said
        .trim_start_matches("Resumed as run ")
        .trim_end_matches('.')
        .to_owned();
    until_text(browser, "the resumed run's title", "#run-title", |t| {
        t == format!("Run {run}")
    })
    .await;
    // The run naps (the service says so), and the page shows it: the tree may still be the
    // stopped run's until its next refresh, so the API is asked first.
    server
        .until("the resumed run to nap", &format!("/v1/runs/{run}"), |a| {
            a.body["nodes"]
                .as_array()
                .is_some_and(|nodes| nodes.contains(&json!("drafts/#0/nap")))
        })
        .await;
    until_text(
        browser,
        "the resumed run's tree",
        "#tree li[data-node='nap']",
        |t| t.contains("drafts/#0/nap"),
    )
    .await;
    run
}

#[tokio::test(flavor = "multi_thread")]
async fn with_a_token_the_page_asks_for_it_once_then_lists_the_runs() {
    let driver = Chromedriver::start();
    let server = Server::start(&[], &["--token", "s3cret"]).with_token("s3cret");
    let run = napping(&server, "page-token").await;
    let browser = driver.browser().await;
    browser
        .goto(&server.url("/"))
        .await
        .expect("the page opens");

    let input = browser
        .wait()
        .at_most(PATIENCE)
        .for_element(Locator::Css("#token-form:not([hidden]) #token"))
        .await
        .expect("the page asks for the token");
    input.send_keys("s3cret").await.expect("the token typed");
    click(&browser, "#token-form button").await;
    until_text(
        &browser,
        "the run listed with the token",
        &format!("tr[data-run='{run}'] .status-cell"),
        |t| t == "running",
    )
    .await;
    until_text(&browser, "the live stream", "#connection", |t| t == "live").await;
    browser.close().await.expect("the session closes");
}
