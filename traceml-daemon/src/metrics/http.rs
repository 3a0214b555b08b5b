//! `--metrics-addr`: the [`Exporter`] served over HTTP/1.1 on its own thread, by `hyper` on a
//! single-threaded tokio runtime. Read-only: `GET /metrics` (and `HEAD`) answers the OpenMetrics
//! exposition, `GET /` a line naming it, anything else 404 or 405; one request per connection,
//! request heads bounded in size (8 KiB, else 431) and time (2 s to send the head, else the
//! connection is closed), a whole connection in 7 s, at most [`MAX_CONNECTIONS`] at once (more are
//! closed unanswered). No TLS and no authentication (docs/metrics.md says why): it listens on
//! 127.0.0.1 unless told otherwise. `serve` exists with the `live` feature (the tokio and hyper
//! it runs on); [`Shared`] and [`parse_addr`] always.
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
#[cfg(feature = "live")]
use std::time::{Duration, Instant};

use super::{DEFAULT_PORT, Exporter};

/// Connections served at once; more are closed unanswered.
pub const MAX_CONNECTIONS: usize = 8;
#[cfg(feature = "live")]
const MAX_HEAD: usize = 8192;
#[cfg(feature = "live")]
const READ_TIMEOUT: Duration = Duration::from_secs(2);
#[cfg(feature = "live")]
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
#[cfg(feature = "live")]
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The exporter shared by the run loops (writers) and the HTTP thread (reader).
pub type Shared = Arc<Mutex<Exporter>>;
/// `--metrics-addr`'s value: `HOST:PORT`, `HOST` (port [`DEFAULT_PORT`]), `:PORT` or `PORT`
/// (host 127.0.0.1), or empty (127.0.0.1:[`DEFAULT_PORT`]). IPv6 hosts in brackets with a port
/// (`[::1]:9466`), bare without one (`::1`). A host name resolves to its first address.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    let local = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let bad = |why: &str| format!("--metrics-addr {s:?}: {why}");
    let port = |p: &str| {
        p.parse::<u16>()
            .map_err(|_| bad("the port must be a number from 0 to 65535"))
    };
    if s.is_empty() {
        return Ok(SocketAddr::new(local, DEFAULT_PORT));
    }
    let bare = s
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(s);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, DEFAULT_PORT));
    }
    if let Some(p) = s.strip_prefix(':') {
        return Ok(SocketAddr::new(local, port(p)?));
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(SocketAddr::new(local, port(s)?));
    }
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let (host, p) = match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (h, port(p)?),
        Some(_) => return Err(bad("write an IPv6 address with a port as [ADDR]:PORT")),
        None => (s, DEFAULT_PORT),
    };
    (host, p)
        .to_socket_addrs()
        .map_err(|e| bad(&format!("cannot resolve {host:?}: {e}")))?
        .next()
        .ok_or_else(|| bad(&format!("{host:?} has no address")))
}

/// Binds `addr` and serves `exporter` on a background thread (its own single-threaded tokio
/// runtime, whatever runtime the caller runs on); returns the bound address (the port the system
/// chose for port 0).
#[cfg(feature = "live")]
pub fn serve(addr: SocketAddr, exporter: Shared) -> std::io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || runtime.block_on(accept_loop(listener, exporter)))?;
    Ok(bound)
}

#[cfg(feature = "live")]
async fn accept_loop(listener: std::net::TcpListener, exporter: Shared) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("metrics: cannot serve: {e}");
            return;
        }
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, or the peer gave up before the accept: try again shortly.
                tracing::debug!("metrics accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // Over the limit the stream is dropped here: closed unanswered.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let exporter = exporter.clone();
        tokio::spawn(async move {
            connection(stream, exporter).await;
            drop(slot);
        });
    }
}

/// Serves one connection: one request, its head within [`READ_TIMEOUT`] and [`MAX_HEAD`], the
/// whole exchange within [`READ_TIMEOUT`] + [`WRITE_TIMEOUT`].
#[cfg(feature = "live")]
async fn connection(stream: tokio::net::TcpStream, exporter: Shared) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let service = hyper::service::service_fn(move |req| {
        let response = respond(&req, &exporter);
        async move { Ok::<_, std::convert::Infallible>(response) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(READ_TIMEOUT)
        .max_header_size(MAX_HEAD)
        .max_buf_size(MAX_HEAD)
        .keep_alive(false)
        .title_case_headers(true)
        .serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout(READ_TIMEOUT + WRITE_TIMEOUT, conn).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!("metrics request: {e}"),
        Err(_) => tracing::debug!("metrics request: timed out"),
    }
}

#[cfg(feature = "live")]
type Body = http_body_util::Full<hyper::body::Bytes>;

/// The answer to one request (`HEAD`'s body is dropped by hyper, its length kept).
#[cfg(feature = "live")]
fn respond<B>(req: &hyper::Request<B>, exporter: &Shared) -> hyper::Response<Body> {
    use hyper::{Method, StatusCode, header};
    let reply = |status: StatusCode, content_type: Option<&'static str>, body: Body| {
        let mut r = hyper::Response::new(body);
        *r.status_mut() = status;
        if let Some(t) = content_type {
            r.headers_mut()
                .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(t));
        }
        r
    };
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        let mut r = reply(StatusCode::METHOD_NOT_ALLOWED, None, Body::default());
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match req.uri().path() {
        "/metrics" => {
            let body = {
                let mut e = exporter.lock().unwrap_or_else(|p| p.into_inner());
                e.prune(Instant::now());
                e.encode()
            };
            reply(StatusCode::OK, Some(CONTENT_TYPE), Body::from(body))
        }
        "/" => reply(
            StatusCode::OK,
            Some("text/plain; charset=utf-8"),
            Body::from("traceml-daemon: metrics at /metrics\n"),
        ),
        _ => reply(StatusCode::NOT_FOUND, None, Body::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        let l = |p| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p);
        assert_eq!(parse_addr(""), Ok(l(DEFAULT_PORT)));
        assert_eq!(parse_addr(":9500"), Ok(l(9500)));
        assert_eq!(parse_addr("9500"), Ok(l(9500)));
        assert_eq!(parse_addr("0.0.0.0"), Ok("0.0.0.0:9466".parse().unwrap()));
        assert_eq!(
            parse_addr("10.1.2.3:9000"),
            Ok("10.1.2.3:9000".parse().unwrap())
        );
        assert_eq!(parse_addr("::1"), Ok("[::1]:9466".parse().unwrap()));
        assert_eq!(parse_addr("[::1]"), Ok("[::1]:9466".parse().unwrap()));
        assert_eq!(parse_addr("[::]:80"), Ok("[::]:80".parse().unwrap()));
        assert_eq!(parse_addr("localhost:81").map(|a| a.port()), Ok(81));
        assert!(parse_addr("localhost").is_ok_and(|a| a.port() == DEFAULT_PORT));
        assert!(parse_addr(":70000").unwrap_err().contains("port"));
        assert!(parse_addr("1.2.3.4:x").unwrap_err().contains("port"));
    }

    #[cfg(feature = "live")]
    mod serving {
        use super::*;
        use std::io::{Read, Write};
        use std::net::TcpStream;

        fn get(addr: SocketAddr, request: &str) -> String {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(request.as_bytes()).unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        }

        fn exporter(ranks: usize) -> Shared {
            let e: Shared = Arc::new(Mutex::new(Exporter::default()));
            for r in 0..ranks {
                e.lock().unwrap().attached(
                    "python-1-x",
                    &r.to_string(),
                    crate::metrics::JobLabels {
                        pid: 1 + r as u32,
                        command: "python train.py --epochs 3".into(),
                        ..Default::default()
                    },
                );
            }
            e
        }

        fn content_length(r: &str) -> usize {
            r.lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .expect("a Content-Length")
                .parse()
                .unwrap()
        }

        #[test]
        fn serves_the_exposition_and_nothing_else() {
            let addr = serve("127.0.0.1:0".parse().unwrap(), exporter(1)).unwrap();
            let r = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
            assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
            assert!(r.contains(&format!("Content-Type: {CONTENT_TYPE}")), "{r}");
            assert!(r.contains("Connection: close\r\n"), "{r}");
            assert!(r.contains("traceml_attached_jobs 1\n"), "{r}");
            assert!(r.ends_with("# EOF\n"), "{r}");
            let body = r.split("\r\n\r\n").nth(1).unwrap();
            assert_eq!(body.len(), content_length(&r));
            // An HTTP/1.0 client is answered in HTTP/1.0; HEAD has the length and no body.
            let h = get(addr, "HEAD /metrics?x=1 HTTP/1.0\r\n\r\n");
            assert!(
                h.starts_with("HTTP/1.0 200 OK") && h.ends_with("\r\n\r\n"),
                "{h}"
            );
            assert_eq!(content_length(&h), body.len());
            let root = get(addr, "GET / HTTP/1.1\r\n\r\n");
            assert!(root.starts_with("HTTP/1.1 200 OK"), "{root}");
            assert!(root.ends_with("\r\n\r\ntraceml-daemon: metrics at /metrics\n"));
            assert!(get(addr, "GET /other HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
            let h404 = get(addr, "HEAD /other HTTP/1.1\r\n\r\n");
            assert!(h404.starts_with("HTTP/1.1 404") && h404.ends_with("\r\n\r\n"));
            let post = get(addr, "POST /metrics HTTP/1.1\r\n\r\n");
            assert!(post.starts_with("HTTP/1.1 405") && post.contains("Allow: GET, HEAD"));
            let put = get(addr, "PUT / HTTP/1.1\r\nContent-Length: 2\r\n\r\nab");
            assert!(put.starts_with("HTTP/1.1 405"), "{put}");
            // Not HTTP at all.
            assert!(get(addr, "\x01\x02 nonsense\r\n\r\n").starts_with("HTTP/1.1 400"));
        }

        #[test]
        fn a_large_exposition_is_sent_whole() {
            let addr = serve("127.0.0.1:0".parse().unwrap(), exporter(400)).unwrap();
            let r = get(addr, "GET /metrics HTTP/1.1\r\n\r\n");
            let body = r.split_once("\r\n\r\n").unwrap().1;
            assert!(body.len() > 64 << 10, "{}", body.len());
            assert_eq!(body.len(), content_length(&r));
            assert!(body.ends_with("# EOF\n"));
        }

        #[test]
        fn an_oversized_head_is_431() {
            let addr = serve("127.0.0.1:0".parse().unwrap(), exporter(0)).unwrap();
            // Exactly the limit, with no end of head: all of it is read, so the answer is not
            // lost to a reset for unread bytes.
            let mut head = "GET /metrics HTTP/1.1\r\nX-Filler: ".to_owned();
            head.push_str(&"a".repeat(MAX_HEAD - head.len()));
            let r = get(addr, &head);
            assert!(
                r.starts_with("HTTP/1.1 431 Request Header Fields Too Large"),
                "{r}"
            );
            // Just under it is served.
            let mut head = "GET /metrics HTTP/1.1\r\nX-Filler: ".to_owned();
            head.push_str(&"a".repeat(MAX_HEAD - head.len() - 8));
            head.push_str("\r\n\r\n");
            assert!(get(addr, &head).starts_with("HTTP/1.1 200 OK"));
        }

        /// Reads until the server closes: what it sent, and when.
        fn until_closed(s: &mut TcpStream) -> (String, Instant) {
            let mut out = Vec::new();
            let mut buf = [0u8; 1024];
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => out.extend_from_slice(&buf[..n]),
                }
            }
            (String::from_utf8_lossy(&out).into_owned(), Instant::now())
        }

        #[test]
        fn a_slow_head_is_cut_off_after_the_read_timeout() {
            let addr = serve("127.0.0.1:0".parse().unwrap(), exporter(0)).unwrap();
            // Silent.
            let t = Instant::now();
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let (out, at) = until_closed(&mut s);
            assert_eq!(out, "");
            let waited = at - t;
            assert!(
                waited >= READ_TIMEOUT && waited < READ_TIMEOUT * 3,
                "{waited:?}"
            );
            // Trickling a header a byte at a time (slowloris): the deadline is from the connect,
            // not from the last byte.
            let t = Instant::now();
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nX: ").unwrap();
            let trickle = s.try_clone().unwrap();
            std::thread::spawn(move || {
                let mut trickle = trickle;
                while trickle.write_all(b"a").is_ok() {
                    std::thread::sleep(Duration::from_millis(200));
                }
            });
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let (out, at) = until_closed(&mut s);
            assert!(!out.contains(" 200 "), "{out}");
            let waited = at - t;
            assert!(
                waited >= READ_TIMEOUT && waited < READ_TIMEOUT * 3,
                "{waited:?}"
            );
        }

        #[test]
        fn connections_over_the_limit_are_closed_unanswered() {
            let addr = serve("127.0.0.1:0".parse().unwrap(), exporter(0)).unwrap();
            let idle: Vec<TcpStream> = (0..MAX_CONNECTIONS)
                .map(|_| TcpStream::connect(addr).unwrap())
                .collect();
            // The idle ones are accepted (in order) before this one.
            std::thread::sleep(Duration::from_millis(200));
            let t = Instant::now();
            let mut over = TcpStream::connect(addr).unwrap();
            over.set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let _ = over.write_all(b"GET /metrics HTTP/1.1\r\n\r\n");
            let (out, at) = until_closed(&mut over);
            assert_eq!(out, "");
            assert!(at - t < READ_TIMEOUT, "{:?}", at - t);
            // A client that goes away frees its slot at once.
            drop(idle);
            std::thread::sleep(Duration::from_millis(200));
            let r = get(addr, "GET /metrics HTTP/1.1\r\n\r\n");
            assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
        }
    }
}
