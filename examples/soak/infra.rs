//! The run's own resources, and the fault proxies in front of them: a database on the run's
//! own PostgreSQL server ([`crate::postgres`]), a RabbitMQ queue (with its dead-letter queue and retry buckets) and an
//! SQS queue on the emulator, each named after the run and removed at the end ([`Infra::remove`],
//! or, if the driver never got there, on drop), except the database of a failed run, kept for
//! its post-mortem.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{anyhow, Context};
use dedup_worker::testing::fault_proxy::FaultProxy;
use dedup_worker_core::store::Store;
use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use sqlx::{Connection, PgConnection};

use crate::plan::{Dependency, DEPENDENCIES};
use crate::sqs_dup::SqsDuplicator;

/// Every call the driver makes to a service waits at most this long.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The database queue's name (in the run's own database).
pub const DATABASE_QUEUE: &str = "soak.events";

pub struct Infra {
    admin_url: String,
    /// The run's database, reached directly (the driver) and through the proxy (the processes).
    pub database: String,
    pub database_url: String,
    pub database_url_proxied: String,
    pub amqp_url_proxied: String,
    pub amqp_url: String,
    pub rabbit_queue: String,
    pub aws_endpoint_proxied: String,
    pub sqs_queue_url: String,
    pub sqs_queue_url_proxied: String,
    pub sqs: aws_sdk_sqs::Client,
    pub proxies: HashMap<Dependency, FaultProxy>,
    /// Between the SQS lane's fault proxy and the emulator.
    pub sqs_duplicator: Option<SqsDuplicator>,
    removed: AtomicBool,
}

/// `host:port` of a URL (the default port of its scheme when it names none), and the
/// authority as written in it.
fn authority(url: &str) -> anyhow::Result<(String, String)> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| anyhow!("{url:?} is not a URL"))?;
    let written = rest.split(['/', '?']).next().unwrap_or_default();
    let host_port = written.rsplit('@').next().unwrap_or_default();
    let with_port = if host_port.contains(':') {
        host_port.to_owned()
    } else {
        let port = match scheme {
            "postgres" | "postgresql" => 5432,
            "amqp" => 5672,
            "https" => 443,
            _ => 80,
        };
        format!("{host_port}:{port}")
    };
    Ok((with_port, host_port.to_owned()))
}

/// `url` with its host and port replaced by the proxy's (credentials and path kept).
fn through(proxy: &FaultProxy, url: &str) -> anyhow::Result<String> {
    let (_, written) = authority(url)?;
    Ok(url.replacen(&written, &format!("127.0.0.1:{}", proxy.port), 1))
}

impl Infra {
    /// Creates the database on the server at `admin_url` and the SQS queue, and starts the
    /// proxies (the RabbitMQ queue is declared by the processes themselves).
    pub async fn create(
        run_id: &str,
        sink: SocketAddr,
        admin_url: String,
    ) -> anyhow::Result<Infra> {
        let amqp_url = std::env::var("AMQP_URL")
            .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
        let aws_endpoint = std::env::var("AWS_ENDPOINT_URL").context(
            "AWS_ENDPOINT_URL must name the SQS emulator (bench/soak.sh starts moto_server)",
        )?;

        let database = format!("dw_soak_{run_id}");
        let mut admin = tokio::time::timeout(CALL_TIMEOUT, PgConnection::connect(&admin_url))
            .await
            .context("connecting to PostgreSQL timed out")?
            .with_context(|| format!("connecting to PostgreSQL at {admin_url}"))?;
        sqlx::query(&format!("CREATE DATABASE {database}"))
            .execute(&mut admin)
            .await
            .context("creating the run's database")?;
        admin.close().await.ok();
        let database_url = match admin_url.rsplit_once('/') {
            Some((server, _)) => format!("{server}/{database}"),
            None => return Err(anyhow!("{admin_url} is not a postgres:// URL")),
        };

        let sqs = aws_sdk_sqs::Client::new(
            &aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await,
        );
        let rabbit_queue = format!("dw_soak_{run_id}");
        let mut infra = Infra {
            admin_url,
            database: database.clone(),
            database_url: database_url.clone(),
            database_url_proxied: String::new(),
            amqp_url_proxied: String::new(),
            amqp_url: amqp_url.clone(),
            rabbit_queue: rabbit_queue.clone(),
            aws_endpoint_proxied: String::new(),
            sqs_queue_url: String::new(),
            sqs_queue_url_proxied: String::new(),
            sqs: sqs.clone(),
            proxies: HashMap::new(),
            sqs_duplicator: None,
            removed: AtomicBool::new(false),
        };
        // From here on, a failure still removes the database (on drop).
        let created = tokio::time::timeout(
            CALL_TIMEOUT,
            sqs.create_queue().queue_name(&rabbit_queue).send(),
        )
        .await
        .context("creating the SQS queue timed out")?
        .context("creating the SQS queue (is moto_server running?)")?;
        infra.sqs_queue_url = created
            .queue_url()
            .ok_or_else(|| anyhow!("the emulator returned no queue URL"))?
            .to_owned();

        let (emulator, _) = authority(&aws_endpoint)?;
        let duplicator = SqsDuplicator::start(
            format!("http://{emulator}"),
            sqs.clone(),
            infra.sqs_queue_url.clone(),
        )
        .await
        .context("starting the SQS duplicating proxy")?;
        let duplicating = format!("http://{}", duplicator.addr);
        infra.sqs_duplicator = Some(duplicator);
        for (dependency, url) in [
            (Dependency::Postgres, database_url.as_str()),
            (Dependency::Rabbitmq, amqp_url.as_str()),
            (Dependency::Sqs, duplicating.as_str()),
        ] {
            let (upstream, _) = authority(url)?;
            infra
                .proxies
                .insert(dependency, FaultProxy::start(&upstream).await);
        }
        infra
            .proxies
            .insert(Dependency::Sink, FaultProxy::start(&sink.to_string()).await);
        infra.database_url_proxied = through(infra.proxy(Dependency::Postgres), &database_url)?;
        infra.amqp_url_proxied = through(infra.proxy(Dependency::Rabbitmq), &amqp_url)?;
        infra.aws_endpoint_proxied = through(infra.proxy(Dependency::Sqs), &aws_endpoint)?;
        infra.sqs_queue_url_proxied = through(infra.proxy(Dependency::Sqs), &infra.sqs_queue_url)?;
        Ok(infra)
    }

    pub fn proxy(&self, dependency: Dependency) -> &FaultProxy {
        &self.proxies[&dependency]
    }

    /// The sink URL the relays are given: through its proxy.
    pub fn sink_url(&self) -> String {
        format!(
            "http://127.0.0.1:{}/hook",
            self.proxy(Dependency::Sink).port
        )
    }

    /// The ordered sink's URL (`outbox.sinks.ordered`): the same receiver behind the same
    /// proxy, so the sink's faults hit both lanes.
    pub fn ordered_sink_url(&self) -> String {
        format!(
            "http://127.0.0.1:{}{}",
            self.proxy(Dependency::Sink).port,
            crate::sink::ORDERED_PATH
        )
    }

    pub fn duplicator(&self) -> &SqsDuplicator {
        self.sqs_duplicator.as_ref().expect("started in create")
    }

    /// Every proxy back to passing, without added latency, and no SQS receive duplicated.
    pub async fn heal(&self) {
        self.duplicator().set(0);
        for dependency in DEPENDENCIES {
            let proxy = self.proxy(dependency);
            proxy.set_latency(Duration::ZERO);
            proxy
                .set(dedup_worker::testing::fault_proxy::Mode::Pass)
                .await;
        }
    }

    /// The driver's own connection to the run's database (not through the proxy).
    pub async fn store(&self) -> anyhow::Result<Store> {
        Store::connect_url(&self.database_url, 4, Duration::from_secs(5))
            .await
            .context("connecting to the run's database")
    }

    /// Messages still in each queue (the database queue, RabbitMQ, SQS; -1 where the count
    /// could not be read): the database queue's rows, RabbitMQ's ready messages (unacked ones
    /// are not counted by the broker), SQS's visible, in-flight and delayed ones.
    pub async fn queue_depths(&self, store: &Store) -> [i64; 3] {
        let database = async { Ok::<_, anyhow::Error>(store.queue().depth(DATABASE_QUEUE).await?) };
        let (database, rabbit, sqs) = tokio::join!(
            tokio::time::timeout(CALL_TIMEOUT, database),
            tokio::time::timeout(CALL_TIMEOUT, self.rabbit_depth()),
            tokio::time::timeout(CALL_TIMEOUT, self.sqs_depth()),
        );
        [database, rabbit, sqs].map(|depth| match depth {
            Ok(Ok(n)) => n,
            _ => -1,
        })
    }

    async fn rabbit_depth(&self) -> anyhow::Result<i64> {
        let connection =
            lapin::Connection::connect(&self.amqp_url, lapin::ConnectionProperties::default())
                .await?;
        let channel = connection.create_channel().await?;
        let declared = channel
            .queue_declare(
                self.rabbit_queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await;
        let _ = connection.close(200, "done".into()).await;
        Ok(i64::from(declared?.message_count()))
    }

    async fn sqs_depth(&self) -> anyhow::Result<i64> {
        use aws_sdk_sqs::types::QueueAttributeName as A;
        let answer = self
            .sqs
            .get_queue_attributes()
            .queue_url(&self.sqs_queue_url)
            .attribute_names(A::ApproximateNumberOfMessages)
            .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
            .attribute_names(A::ApproximateNumberOfMessagesDelayed)
            .send()
            .await?;
        Ok(answer
            .attributes()
            .map(|a| a.values().filter_map(|v| v.parse::<i64>().ok()).sum())
            .unwrap_or(0))
    }

    /// Removes the queues, and the database unless `keep_database` (once).
    pub async fn remove(&self, keep_database: bool) {
        if !self.removed.swap(true, Ordering::SeqCst) {
            remove_all(self.resources(), keep_database).await;
        }
    }

    fn resources(&self) -> Resources {
        Resources {
            admin_url: self.admin_url.clone(),
            database: self.database.clone(),
            amqp_url: self.amqp_url.clone(),
            rabbit_queue: self.rabbit_queue.clone(),
            sqs: self.sqs.clone(),
            sqs_queue_url: self.sqs_queue_url.clone(),
        }
    }
}

impl Drop for Infra {
    fn drop(&mut self) {
        if self.removed.swap(true, Ordering::SeqCst) {
            return;
        }
        // The driver failed before removing them: on a thread with a runtime of its own (this
        // one may be shutting down).
        let resources = self.resources();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(remove_all(resources, false));
            Some(())
        })
        .join();
    }
}

struct Resources {
    admin_url: String,
    database: String,
    amqp_url: String,
    rabbit_queue: String,
    sqs: aws_sdk_sqs::Client,
    sqs_queue_url: String,
}

async fn remove_all(r: Resources, keep_database: bool) {
    if !r.sqs_queue_url.is_empty() {
        let delete = r.sqs.delete_queue().queue_url(&r.sqs_queue_url).send();
        let _ = tokio::time::timeout(CALL_TIMEOUT, delete).await;
    }
    let _ = tokio::time::timeout(CALL_TIMEOUT, remove_rabbit_queues(&r)).await;
    if !keep_database {
        let _ = tokio::time::timeout(CALL_TIMEOUT, drop_database(&r)).await;
    }
}

/// The queue, its dead-letter queue, and every retry bucket the consumers may have declared
/// (`<queue>.retry.<2^k ms>`; deleting one that does not exist is not an error in RabbitMQ).
async fn remove_rabbit_queues(r: &Resources) -> anyhow::Result<()> {
    let connection =
        lapin::Connection::connect(&r.amqp_url, lapin::ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    let mut names = vec![r.rabbit_queue.clone(), format!("{}.dead", r.rabbit_queue)];
    names.extend((7..=23).map(|k| format!("{}.retry.{}", r.rabbit_queue, 1u64 << k)));
    for name in names {
        channel
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await?;
    }
    let _ = connection.close(200, "done".into()).await;
    Ok(())
}

async fn drop_database(r: &Resources) -> anyhow::Result<()> {
    let mut admin = PgConnection::connect(&r.admin_url).await?;
    sqlx::query(&format!(
        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
        r.database
    ))
    .execute(&mut admin)
    .await?;
    admin.close().await.ok();
    Ok(())
}
