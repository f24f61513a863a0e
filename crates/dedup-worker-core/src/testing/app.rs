//! [`TestApp`]: the application in the test's own process, on port 0, with the test's
//! settings ([`test_settings`]) and [`Service`] (its handler, its migrations).

use std::net::SocketAddr;

use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::startup::{Application, Service};
use crate::store::Store;

/// The Stripe webhook secret [`test_settings`] configures: sign a test's events with it.
pub const TEST_SECRET: &str = "whsec_test_secret";

/// Settings for a [`TestApp`] on the database at `db_url`: the defaults (config/default.toml),
/// listening on 127.0.0.1 port 0, the Stripe secret [`TEST_SECRET`], then each `(key, value)`
/// of `values` (dotted keys as in the TOML: `("consumer.max_attempts", json!(2))`). Never the
/// process environment: a `DATABASE_URL` of the machine's must not leak into a test.
///
/// # Panics
///
/// When the result does not validate (a value of the wrong type, a setting that requires
/// another).
pub fn test_settings(db_url: &str, values: &[(&str, serde_json::Value)]) -> Settings {
    use figment::providers::Serialized;
    let mut figment = crate::config::defaults()
        .merge(Serialized::default("database_url", db_url))
        .merge(Serialized::default("http.listen", "127.0.0.1:0"))
        .merge(Serialized::default("stripe.secrets", TEST_SECRET));
    for (key, value) in values {
        figment = figment.merge(Serialized::default(key, value.clone()));
    }
    Settings::from_figment(figment).expect("valid test settings")
}

/// An application running in this process on port 0: the roles `settings` enables (by
/// default the ingress, the consumer and the relay) with the test's [`Service`] (its
/// handler, its migrations), until [`TestApp::stop`].
///
/// ```no_run
/// # async fn example() {
/// use dedup_worker_core::Service;
/// use dedup_worker_core::testing::{test_settings, Backend, TestApp, TestDb};
///
/// let db = TestDb::new(Backend::Sqlite).await;
/// let app = TestApp::spawn(test_settings(&db.url, &[]), Service::new()).await;
/// let webhook = app.url("/webhooks/stripe");
/// # let _ = webhook;
/// app.stop().await;
/// # }
/// ```
#[derive(Debug)]
pub struct TestApp {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Where the operator console listens, when `admin.listen` is set.
    pub admin_addr: Option<SocketAddr>,
    /// Its store, to read what it wrote.
    pub store: Store,
    /// Cancelled by [`TestApp::stop`]; cancel it yourself to stop without waiting.
    pub shutdown: CancellationToken,
    /// The task running it.
    pub task: tokio::task::JoinHandle<()>,
}

impl TestApp {
    /// Builds the application (connecting, migrating unless `database.migrate_on_start` is
    /// off, binding) and runs it on a task of the test's runtime.
    ///
    /// # Panics
    ///
    /// When it does not build (the database cannot be reached, the handler does not run on
    /// the configured store); the task panics if the application fails while running.
    pub async fn spawn(settings: Settings, service: Service) -> Self {
        let app = Application::build(settings, service)
            .await
            .expect("build app");
        let addr = app.local_addr().expect("addr");
        let admin_addr = app.local_admin_addr();
        let store = app.store().clone();
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let task = tokio::spawn(async move {
            app.run(token).await.expect("app run");
        });
        TestApp {
            addr,
            admin_addr,
            store,
            shutdown,
            task,
        }
    }

    /// The URL of `path` (`/webhooks/stripe`, `/readyz`, `/metrics`) on this application.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The URL of `path` on the operator console.
    ///
    /// # Panics
    ///
    /// When the settings did not set `admin.listen`.
    pub fn admin_url(&self, path: &str) -> String {
        let addr = self.admin_addr.expect("admin.listen is set");
        format!("http://{addr}{path}")
    }

    /// Stops it as SIGTERM stops the binary (accepted work is finished and committed) and
    /// waits until it has.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}
