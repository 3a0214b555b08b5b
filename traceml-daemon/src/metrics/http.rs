//! `--metrics-addr`: the [`Exporter`] served over HTTP/1.1 on its own thread. A minimal,
//! read-only server: `GET /metrics` (and `HEAD`) answers the OpenMetrics exposition, `GET /` a
//! line naming it, anything else 404 or 405; one request per connection, requests bounded in size
//! (8 KiB) and time (2 s to send the head), at most [`MAX_CONNECTIONS`] at once. No TLS and no
//! authentication (docs/metrics.md says why): it listens on 127.0.0.1 unless told otherwise.
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{DEFAULT_PORT, Exporter};

/// Connections served at once; more are closed unanswered.
pub const MAX_CONNECTIONS: usize = 8;
const MAX_HEAD: usize = 8192;
const READ_TIMEOUT: Duration = Duration::from_secs(2);
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
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

/// Binds `addr` and serves `exporter` on a background thread; returns the bound address (the
/// port the system chose for port 0).
pub fn serve(addr: SocketAddr, exporter: Shared) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || accept_loop(listener, exporter))?;
    Ok(bound)
}

fn accept_loop(listener: TcpListener, exporter: Shared) {
    let active = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::AcqRel);
            continue;
        }
        let (exporter, done) = (exporter.clone(), active.clone());
        let spawned = std::thread::Builder::new()
            .name("metrics-conn".into())
            .spawn(move || {
                if let Err(e) = handle(stream, &exporter) {
                    tracing::debug!("metrics request: {e}");
                }
                done.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            active.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Reads one request head and answers it.
fn handle(mut stream: TcpStream, exporter: &Shared) -> std::io::Result<()> {
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let deadline = Instant::now() + READ_TIMEOUT;
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_HEAD || Instant::now() > deadline {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "",
                b"",
                true,
            );
        }
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let with_body = method != "HEAD";
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let body = {
                let mut e = exporter.lock().unwrap_or_else(|p| p.into_inner());
                e.prune(Instant::now());
                e.encode()
            };
            respond(
                &mut stream,
                "200 OK",
                CONTENT_TYPE,
                body.as_bytes(),
                with_body,
            )
        }
        ("GET" | "HEAD", "/") => respond(
            &mut stream,
            "200 OK",
            "text/plain; charset=utf-8",
            b"traceml-daemon: metrics at /metrics\n",
            with_body,
        ),
        ("GET" | "HEAD", _) => respond(&mut stream, "404 Not Found", "", b"", with_body),
        _ => respond(&mut stream, "405 Method Not Allowed", "", b"", true),
    }
}

fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &[u8],
    with_body: bool,
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if !content_type.is_empty() {
        head.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    if status.starts_with("405") {
        head.push_str("Allow: GET, HEAD\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    if with_body {
        stream.write_all(body)?;
    }
    stream.flush()
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

    fn get(addr: SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_the_exposition_and_nothing_else() {
        let e: Shared = Arc::new(Mutex::new(Exporter::default()));
        e.lock().unwrap().attached(
            "python-1-x",
            "0",
            super::super::JobInfo {
                pid: 1,
                ..Default::default()
            },
        );
        let addr = serve("127.0.0.1:0".parse().unwrap(), e).unwrap();
        let r = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.contains(&format!("Content-Type: {CONTENT_TYPE}")), "{r}");
        assert!(r.contains("traceml_attached_jobs 1\n"), "{r}");
        assert!(r.ends_with("# EOF\n"), "{r}");
        let body = r.split("\r\n\r\n").nth(1).unwrap();
        let len: usize = r
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(body.len(), len);
        let h = get(addr, "HEAD /metrics?x=1 HTTP/1.0\r\n\r\n");
        assert!(
            h.starts_with("HTTP/1.1 200 OK") && h.ends_with("\r\n\r\n"),
            "{h}"
        );
        assert!(get(addr, "GET /other HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        let post = get(addr, "POST /metrics HTTP/1.1\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405") && post.contains("Allow: GET, HEAD"));
    }
}
