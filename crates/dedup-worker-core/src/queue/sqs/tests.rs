//! The SQS client's timeouts, against a stand-in endpoint that answers late or never (no
//! emulator needed: only the calls' bounds are under test).

use std::time::Duration;

use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region, SharedCredentialsProvider};
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// The client's per-attempt bound in these tests: far below the long poll below.
const CALL_TIMEOUT: Duration = Duration::from_millis(200);
/// Guards the test itself: a call that never gives up fails the test instead of hanging it.
const NEVER: Duration = Duration::from_secs(20);

/// An HTTP endpoint answering each request with an empty SQS answer (`{}`) after `delay`, or
/// holding it unanswered when `delay` is `None`. Returns its URL.
async fn endpoint(delay: Option<Duration>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((connection, _)) = listener.accept().await {
            tokio::spawn(answer(connection, delay));
        }
    });
    url
}

async fn answer(mut connection: TcpStream, delay: Option<Duration>) {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        // One request: its head, then as many body bytes as it announces.
        let head_end = loop {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            match connection.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buffer.len() < head_end + length {
            match connection.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        buffer.drain(..head_end + length);
        let Some(delay) = delay else {
            return std::future::pending().await;
        };
        tokio::time::sleep(delay).await;
        let response = "HTTP/1.1 200 OK\r\ncontent-type: application/x-amz-json-1.0\r\n\
                        content-length: 2\r\n\r\n{}";
        if connection.write_all(response.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// The transport as [`SqsQueue::from_env`] builds it, on `url`.
fn queue(url: &str) -> SqsQueue {
    let sdk = aws_config::SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(url)
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            "test", "test", None, None, "tests",
        )))
        .build();
    let client = Client::from_conf(client_config(&sdk, CALL_TIMEOUT));
    SqsQueue::with_client(
        client,
        format!("{url}/000000000000/q"),
        Duration::from_secs(30),
    )
}

fn tag() -> DeliveryTag {
    DeliveryTag::Sqs {
        receipt_handle: "handle".into(),
    }
}

/// A long poll takes its wait, longer than the client's bound on other calls: its own attempt
/// and operation timeouts replace the client's, or every idle poll would be cut.
#[tokio::test]
async fn a_long_poll_outlasts_the_clients_call_timeout() {
    let sqs = queue(&endpoint(Some(CALL_TIMEOUT * ATTEMPTS_PER_CALL * 3)).await);
    let received = tokio::time::timeout(NEVER, sqs.receive(1, Duration::from_secs(1)))
        .await
        .expect("the poll ends");
    assert!(received.expect("a long poll is not cut").is_empty());
}

/// SQS that never answers: every other call gives up with an error instead of waiting.
#[tokio::test]
async fn every_call_gives_up_on_an_endpoint_that_never_answers() {
    let sqs = queue(&endpoint(None).await);
    let delivery = Delivery {
        tag: tag(),
        source: None,
        message_id: None,
        message_type: None,
        payload: Bytes::new(),
        attempts: 1,
        enqueued_at: None,
        defect: None,
        give_up: None,
        traceparent: None,
        stripe_signature: None,
        sender_headers: crate::event::SenderHeaders::default(),
    };
    let message = OutgoingMessage {
        source: None,
        message_id: Some("evt_1".into()),
        message_type: None,
        payload: Bytes::from_static(b"{}"),
        traceparent: None,
        stripe_signature: None,
        sender_headers: crate::event::SenderHeaders::default(),
    };
    let tags = [tag()];
    let calls: Vec<(
        &str,
        futures::future::BoxFuture<'_, Result<(), TransportError>>,
    )> = vec![
        ("publish", Box::pin(sqs.publish(message))),
        ("ack", Box::pin(sqs.ack(&tags))),
        ("release", Box::pin(sqs.release(&tags))),
        (
            "extend_leases",
            Box::pin(async {
                sqs.extend_leases(&tags, Duration::from_secs(30))
                    .await
                    .map(drop)
            }),
        ),
        (
            "retry_later",
            Box::pin(sqs.retry_later(&delivery, Duration::from_secs(1))),
        ),
        ("ready", Box::pin(sqs.ready())),
    ];
    for (name, call) in calls {
        let result = tokio::time::timeout(NEVER, call)
            .await
            .unwrap_or_else(|_| panic!("{name} still waits for SQS"));
        assert!(result.is_err(), "{name}: {result:?}");
    }
}
