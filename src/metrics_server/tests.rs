// SPDX-License-Identifier: Apache-2.0
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::thread::JoinHandle;

use proptest::prelude::*;

use super::request::{RequestError, RequestHead, parse};
use super::{Handler, Limits, ListenAddress, PROMETHEUS_TEXT, bind, serve_with};

/// A dcgm-exporter-shaped exposition, as the exporter core renders it.
const EXPOSITION: &str = "\
# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\"GPU-a\",device=\"nvidia0\",modelName=\"NVIDIA A100-SXM4-40GB\",Hostname=\"node\",DCGM_FI_DRIVER_VERSION=\"550.54.15\"} 41
DCGM_FI_DEV_GPU_TEMP{gpu=\"1\",UUID=\"GPU-b\",device=\"nvidia1\",modelName=\"NVIDIA A100-SXM4-40GB\",Hostname=\"node\",DCGM_FI_DRIVER_VERSION=\"550.54.15\",pod=\"train\",namespace=\"ml\",container=\"worker\"} 43
# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu=\"0\",UUID=\"GPU-a\"} 123456789
";

/// A server on an ephemeral loopback port; dropping `stop` (the pipe's writer) ends it.
struct Running {
    addr: SocketAddr,
    stop: Option<std::io::PipeWriter>,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl Running {
    fn start(handler: Handler, limits: Limits) -> Self {
        let listener = bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (reader, writer) = std::io::pipe().unwrap();
        let thread = std::thread::spawn(move || {
            serve_with(listener, handler, PROMETHEUS_TEXT, reader, limits)
        });
        Self {
            addr,
            stop: Some(writer),
            thread: Some(thread),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Stops the server and returns what `serve` returned.
    fn stop(mut self) -> std::io::Result<()> {
        drop(self.stop.take());
        self.thread.take().unwrap().join().unwrap()
    }
}

fn exposition() -> Handler {
    Arc::new(|| Ok(EXPOSITION.to_owned()))
}

/// Sends raw bytes and reads until the server closes.
fn raw(addr: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(request).unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).unwrap();
    out
}

fn head(method: &str, path: &str, keep_alive: bool, has_body: bool) -> RequestHead {
    RequestHead {
        method: method.into(),
        path: path.into(),
        keep_alive,
        has_body,
    }
}

type ParseCase<'a> = (&'a str, &'a [u8], Result<Option<RequestHead>, RequestError>);

#[test]
fn request_heads() {
    let long = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(9000));
    let cases: Vec<ParseCase<'_>> = vec![
        (
            "plain",
            b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
            Ok(Some(head("GET", "/metrics", true, false))),
        ),
        (
            "query",
            b"GET /metrics?a=b HTTP/1.1\r\n\r\n",
            Ok(Some(head("GET", "/metrics", true, false))),
        ),
        (
            "absolute-form",
            b"GET http://h:9400/health HTTP/1.1\r\n\r\n",
            Ok(Some(head("GET", "/health", true, false))),
        ),
        (
            "1.0",
            b"GET / HTTP/1.0\r\n\r\n",
            Ok(Some(head("GET", "/", false, false))),
        ),
        (
            "1.0 keep-alive",
            b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
            Ok(Some(head("GET", "/", true, false))),
        ),
        (
            "close",
            b"HEAD / HTTP/1.1\r\nconnection: close\r\n\r\n",
            Ok(Some(head("HEAD", "/", false, false))),
        ),
        (
            "body",
            b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
            Ok(Some(head("POST", "/metrics", true, true))),
        ),
        ("incomplete", b"GET /metrics HTTP/1.1\r\nHost:", Ok(None)),
        (
            "no target",
            b"GET HTTP/1.1\r\n\r\n",
            Err(RequestError::RequestLine("GET HTTP/1.1".into())),
        ),
        (
            "relative target",
            b"GET metrics HTTP/1.1\r\n\r\n",
            Err(RequestError::RequestLine("GET metrics HTTP/1.1".into())),
        ),
        (
            "version",
            b"GET / HTTP/2.0\r\n\r\n",
            Err(RequestError::Version("HTTP/2.0".into())),
        ),
        (
            "header without colon",
            b"GET / HTTP/1.1\r\nHost\r\n\r\n",
            Err(RequestError::Header("Host".into())),
        ),
        (
            "space before colon",
            b"GET / HTTP/1.1\r\nHost : x\r\n\r\n",
            Err(RequestError::Header("Host : x".into())),
        ),
        (
            "bad length",
            b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            Err(RequestError::Header("Content-Length: -1".into())),
        ),
        ("too large", long.as_bytes(), Err(RequestError::TooLarge)),
        (
            "not UTF-8",
            b"GET /\xff HTTP/1.1\r\n\r\n",
            Err(RequestError::NotUtf8),
        ),
    ];
    for (name, input, expected) in cases {
        let got = parse(input).map(|o| o.map(|(head, _)| head));
        assert_eq!(got, expected, "case {name}");
    }
}

#[test]
fn listen_addresses() {
    let ok = [
        (":9400", ListenAddress::AllInterfaces(9400)),
        (
            "127.0.0.1:9400",
            ListenAddress::Ip("127.0.0.1:9400".parse().unwrap()),
        ),
        (
            "[::1]:9400",
            ListenAddress::Ip("[::1]:9400".parse().unwrap()),
        ),
        ("localhost:80", ListenAddress::Host("localhost".into(), 80)),
    ];
    for (text, expected) in ok {
        assert_eq!(
            text.parse::<ListenAddress>().unwrap(),
            expected,
            "case {text}"
        );
    }
    for bad in [
        "9400",
        ":94000",
        ":http",
        "::1:9400",
        "[::1:9400",
        "[nope]:1",
        "a b:1",
        "",
    ] {
        let error = bad.parse::<ListenAddress>().unwrap_err().to_string();
        assert!(
            error.contains(&format!("{bad:?}")) && error.contains(":PORT"),
            "case {bad}: {error}"
        );
    }
    // every interface, on a free port
    let listener = bind(":0").unwrap();
    assert!(listener.local_addr().unwrap().ip().is_unspecified());
    let taken = listener.local_addr().unwrap().port();
    let error = bind(&format!("127.0.0.1:{taken}")).err();
    // [::]:PORT also takes IPv4, so the same port on 127.0.0.1 is in use (where the host has IPv6)
    if listener.local_addr().unwrap().is_ipv6() {
        let text = error.map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains(&format!("127.0.0.1:{taken}")), "{text}");
    }
}

#[test]
fn routes_statuses_and_keep_alive() {
    let failing: Handler = Arc::new(|| Err("NVML is gone".to_owned()));
    let server = Running::start(exposition(), Limits::default());
    let cases: [(&str, &[u8], &str); 7] = [
        (
            "GET /metrics",
            b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
            "HTTP/1.1 200 OK\r\n",
        ),
        (
            "GET /health",
            b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n",
            "HTTP/1.1 200 OK\r\n",
        ),
        (
            "unknown path",
            b"GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n",
            "HTTP/1.1 404 Not Found\r\n",
        ),
        (
            "POST",
            b"POST /metrics HTTP/1.1\r\nContent-Length: 1\r\n\r\nx",
            "HTTP/1.1 405 Method Not Allowed\r\n",
        ),
        (
            "garbage",
            b"\x16\x03\x01 hello\r\n\r\n",
            "HTTP/1.1 400 Bad Request\r\n",
        ),
        (
            "HTTP/2 preface",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "HTTP/1.1 400 Bad Request\r\n",
        ),
        ("long head", &[b'a'; 9000], "HTTP/1.1 431 "),
    ];
    for (name, request, status) in cases {
        let got = raw(server.addr, request);
        assert!(got.starts_with(status), "case {name}: {got:?}");
    }
    let head = raw(
        server.addr,
        b"HEAD /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
    );
    assert!(
        head.contains(&format!("Content-Length: {}\r\n", EXPOSITION.len())),
        "{head}"
    );
    assert!(head.ends_with("\r\n\r\n"), "HEAD has no body: {head:?}");
    // two pipelined requests on one connection, the second closing it
    let two = raw(
        server.addr,
        b"GET /health HTTP/1.1\r\n\r\nGET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(two.matches("HTTP/1.1 200 OK").count(), 2, "{two}");
    assert!(two.ends_with(EXPOSITION), "{two}");
    server.stop().unwrap();

    let server = Running::start(failing, Limits::default());
    let got = raw(
        server.addr,
        b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
    );
    assert!(
        got.starts_with("HTTP/1.1 500 ") && got.ends_with("NVML is gone\n"),
        "{got}"
    );
    server.stop().unwrap();
}

#[test]
fn connections_over_the_limit_get_503() {
    let server = Running::start(
        exposition(),
        Limits {
            connections: 1,
            ..Limits::default()
        },
    );
    // the first connection holds the only slot (kept alive, idle)
    let mut first = TcpStream::connect(server.addr).unwrap();
    first.write_all(b"GET /health HTTP/1.1\r\n\r\n").unwrap();
    let mut buf = [0u8; 256];
    let n = first.read(&mut buf).unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    let second = raw(server.addr, b"GET /metrics HTTP/1.1\r\n\r\n");
    assert!(second.starts_with("HTTP/1.1 503 "), "{second}");
    drop(first);
    server.stop().unwrap();
}

#[test]
fn curl_urllib_and_the_prometheus_parser() {
    let server = Running::start(exposition(), Limits::default());
    let curl = Command::new("curl")
        .args(["-sS", "--fail", "-D", "-", "--max-time", "10"])
        .arg(server.url("/metrics"))
        .output()
        .expect("curl is installed");
    let text = String::from_utf8_lossy(&curl.stdout);
    assert!(
        curl.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&curl.stderr)
    );
    assert!(
        text.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8"),
        "{text}"
    );
    assert!(text.ends_with(EXPOSITION), "{text}");
    let status = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            "DELETE",
            "--max-time",
            "10",
        ])
        .arg(server.url("/metrics"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&status.stdout), "405");

    // urllib fetches; prometheus_client's own parser reads what we served
    let script = r#"
import sys, urllib.request
from prometheus_client.parser import text_string_to_metric_families
base = sys.argv[1]
with urllib.request.urlopen(base + "/health", timeout=10) as r:
    assert r.status == 200, r.status
with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4"), r.headers
    body = r.read().decode()
for family in text_string_to_metric_families(body):
    for s in family.samples:
        print(family.name, family.type, s.name, sorted(s.labels.items()), s.value)
try:
    urllib.request.urlopen(base + "/missing", timeout=10)
    print("no error for /missing")
except urllib.error.HTTPError as e:
    print("missing", e.code)
"#;
    let python = Command::new("python3")
        .args(["-c", script, &server.url("")])
        .output()
        .expect("python3 is installed");
    let out = String::from_utf8_lossy(&python.stdout);
    assert!(
        python.status.success(),
        "python (prometheus-client installed by .ci/run?): {}",
        String::from_utf8_lossy(&python.stderr)
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert!(lines[0].starts_with("DCGM_FI_DEV_GPU_TEMP gauge DCGM_FI_DEV_GPU_TEMP [('DCGM_FI_DRIVER_VERSION', '550.54.15')"), "{out}");
    assert!(
        lines[1].contains("('pod', 'train')") && lines[1].ends_with(" 43.0"),
        "{out}"
    );
    // the parser names counters without their _total suffix in the family
    assert!(
        lines[2].starts_with("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter "),
        "{out}"
    );
    assert_eq!(lines[3], "missing 404", "{out}");
    server.stop().unwrap();
}

proptest! {
    #[test]
    fn the_request_parser_never_panics(input in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = parse(&input);
    }

    #[test]
    fn the_request_parser_never_panics_on_near_requests(
        method in "[A-Z]{0,8}",
        target in "[ -~]{0,40}",
        headers in proptest::collection::vec("[ -~]{0,40}", 0..6),
    ) {
        let text = format!("{method} {target} HTTP/1.1\r\n{}\r\n\r\n", headers.join("\r\n"));
        let _ = parse(text.as_bytes());
    }
}
