//! A headless Debian chromium driven through its chromedriver, one of each per test: started on
//! a free port, in a process group of their own with a temporary directory of their own
//! (profile, `TMPDIR`), and gone when the [`Browser`] is: closed ([`Browser::close`]) or, if the
//! test panicked first, the whole group killed and the directory removed on drop.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::json;

/// Debian's packages `chromium` and `chromium-driver` (scripts/test.sh installs them).
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// How long chromedriver may take to say its port, and a page or element to appear.
const START: Duration = Duration::from_secs(30);
pub const WAIT: Duration = Duration::from_secs(30);
/// How many chromedrivers [`Driver::start`] tries before giving up.
const STARTS: usize = 3;

/// chromedriver and the chromium it starts: the process group is killed and the directory
/// removed when this is dropped.
struct Driver {
    child: Child,
    port: u16,
    /// The browser's profile and temporary files.
    dir: tempfile::TempDir,
}

impl Driver {
    /// `zone`: the `TZ` chromedriver (and the chromium it starts) runs in; `None`: this
    /// process's. A chromedriver that exits before saying its port (seen once in CI, on a busy
    /// machine, without a word kept) is started again, up to [`STARTS`] times; what each one
    /// said and how it ended is in the panic if none comes up.
    fn start(zone: Option<&str>) -> Self {
        for program in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                Path::new(program).exists(),
                "{program} is missing: `apt-get install chromium chromium-driver` \
                 (scripts/test.sh installs them)"
            );
        }
        let mut failures = Vec::new();
        for _ in 0..STARTS {
            match Self::try_start(zone) {
                Ok(driver) => return driver,
                Err(failure) => failures.push(failure),
            }
        }
        panic!(
            "chromedriver did not start in {STARTS} tries:\n{}",
            failures.join("\n---\n")
        );
    }

    /// One chromedriver: `Err` says how it ended and everything it printed.
    fn try_start(zone: Option<&str>) -> Result<Self, String> {
        let dir = tempfile::Builder::new()
            .prefix("dedup-console-browser-")
            .tempdir()
            .expect("the browser's directory");
        let mut command = Command::new(CHROMEDRIVER);
        if let Some(zone) = zone {
            command.env("TZ", zone);
        }
        let mut child = command
            .arg("--port=0")
            .env("TMPDIR", dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group: chromium and its helpers are killed with it (Drop).
            .process_group(0)
            .spawn()
            .expect("start chromedriver");
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let (port_tx, port_rx) = mpsc::channel();
        let said = Arc::new(Mutex::new(Vec::<String>::new()));
        // Reads the port, then drains what else it says until it exits.
        let heard = said.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("was started successfully on port ").nth(1) {
                    let port = rest.trim_end_matches('.').trim().parse::<u16>();
                    let _ = port_tx.send(port.ok());
                }
                heard.lock().unwrap().push(line);
            }
        });
        // stderr kept too: why it exited, if it does.
        let heard = said.clone();
        let stderr_read = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                heard.lock().unwrap().push(format!("stderr: {line}"));
            }
        });
        // Killed on drop from here on, if it does not say its port either.
        let mut driver = Driver {
            child,
            port: 0,
            dir,
        };
        // The line comes within the deadline, or the pipe closes (it exited), or neither.
        match port_rx.recv_timeout(START) {
            Ok(Some(port)) => {
                driver.port = port;
                Ok(driver)
            }
            Ok(None) => panic!("chromedriver said a port that is not a number"),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // Its output closed: it has exited or is about to (a bounded wait all the same).
                let deadline = Instant::now() + Duration::from_secs(5);
                let status = loop {
                    match driver.child.try_wait() {
                        Ok(None) if Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(20))
                        }
                        other => break other,
                    }
                };
                let _ = stderr_read.join();
                let said = said.lock().unwrap().join("\n");
                Err(format!(
                    "exited ({status:?}) before saying its port:\n{said}"
                ))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("chromedriver did not say its port within {START:?}")
            }
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The group this process made (chromedriver's pid): chromedriver, chromium and its
        // helpers, however the test ended.
        if let Ok(pgid) = i32::try_from(self.child.id()) {
            // SAFETY: killpg has no memory-safety preconditions.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
        let _ = self.child.wait();
    }
}

/// A browser session: [`Browser::close`] it at the end of the test (a panic before that kills
/// it on drop).
pub struct Browser {
    pub client: Client,
    // Dropped after `client`.
    driver: Driver,
}

impl Browser {
    /// A headless chromium, 1280×900, its own profile.
    pub async fn start() -> Self {
        Self::started(None).await
    }

    /// [`Browser::start`] with the browser's clock in time zone `zone` (`Asia/Tokyo`).
    pub async fn start_in_zone(zone: &str) -> Self {
        Self::started(Some(zone)).await
    }

    async fn started(zone: Option<&str>) -> Self {
        let driver = Driver::start(zone);
        let profile = driver.dir.path().join("profile");
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-dev-shm-usage",
                    "--window-size=1280,900",
                    "--no-first-run",
                    "--no-default-browser-check",
                    "--disable-background-networking",
                    "--disable-component-update",
                    format!("--user-data-dir={}", profile.display()),
                ],
            }),
        );
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(caps)
            .connect(&driver.url())
            .await
            .expect("a chromium session through chromedriver");
        Browser { client, driver }
    }

    /// Ends the session (chromium quits), then chromedriver.
    pub async fn close(self) {
        let Browser { client, driver } = self;
        let _ = client.close().await;
        drop(driver);
    }

    pub async fn goto(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("open {url}: {e}"));
    }

    /// Loads the page again.
    pub async fn refresh(&self) {
        if let Err(e) = self.client.refresh().await {
            panic!("reload {}: {e}", self.url().await);
        }
    }

    /// The element `css` of the page, waiting up to [`WAIT`] for it.
    pub async fn find(&self, css: &str) -> Element {
        let found = self
            .client
            .wait()
            .at_most(WAIT)
            .for_element(Locator::Css(css))
            .await;
        match found {
            Ok(element) => element,
            Err(e) => panic!("{css} on {}: {e}\n{}", self.url().await, self.text().await),
        }
    }

    /// Every element `css` of the page now.
    pub async fn find_all(&self, css: &str) -> Vec<Element> {
        self.client
            .find_all(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"))
    }

    /// Whether `css` is on the page now.
    pub async fn has(&self, css: &str) -> bool {
        !self.find_all(css).await.is_empty()
    }

    /// The text of `css` (waiting for it), trimmed.
    pub async fn text_of(&self, css: &str) -> String {
        let element = self.find(css).await;
        element
            .text()
            .await
            .unwrap_or_else(|e| panic!("text of {css}: {e}"))
            .trim()
            .to_owned()
    }

    /// The page's text, for failure messages.
    pub async fn text(&self) -> String {
        match self.client.find(Locator::Css("body")).await {
            Ok(body) => body.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    pub async fn url(&self) -> String {
        self.client
            .current_url()
            .await
            .map(|u| u.to_string())
            .unwrap_or_default()
    }

    /// The path of the current page (`/events`), without query.
    pub async fn path(&self) -> String {
        self.client
            .current_url()
            .await
            .map(|u| u.path().to_owned())
            .unwrap_or_default()
    }

    /// Types `value` into the field `css` (cleared first).
    pub async fn fill(&self, css: &str, value: &str) {
        let field = self.find(css).await;
        field
            .clear()
            .await
            .unwrap_or_else(|e| panic!("clear {css}: {e}"));
        field
            .send_keys(value)
            .await
            .unwrap_or_else(|e| panic!("type into {css}: {e}"));
    }

    /// Clicks `css` and waits until the page it leads to (another document) has loaded.
    pub async fn click_and_wait(&self, css: &str) {
        let old = self.find("html").await;
        self.find(css)
            .await
            .click()
            .await
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
        self.wait_until_replaced(&old, css).await;
    }

    /// Waits until `old` (an element of the previous page) is gone: a new document loaded.
    async fn wait_until_replaced(&self, old: &Element, what: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            // A stale element: the document it was in is gone.
            if old.tag_name().await.is_err() {
                let ready = self
                    .client
                    .execute("return document.readyState", vec![])
                    .await;
                if ready.is_ok_and(|s| s == "complete") {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no new page within {WAIT:?} after clicking {what} on {}",
                self.url().await
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// With `SCREENSHOTS=1`, the window as `docs/src/console/{name}.png`.
    pub async fn screenshot(&self, name: &str) {
        if std::env::var("SCREENSHOTS").as_deref() != Ok("1") {
            return;
        }
        let png = self
            .client
            .screenshot()
            .await
            .unwrap_or_else(|e| panic!("screenshot {name}: {e}"));
        let path = screenshot_dir().join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
}

fn screenshot_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/console")
}
