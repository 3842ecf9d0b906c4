//! The `brick-initiatord` binary's control socket end to end: typed
//! requests over the socket, `brick-initiatord status [--json]`, refusals
//! naming the field, `map`/`unmap` of a run-time volume and its state
//! file, and lines that are not requests. The daemon manages an empty root
//! here (no rnbd client), so nothing reaches a kernel.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use control::{Format, Reply, Request, VolumeSpec};

const DAEMON: &str = env!("CARGO_BIN_EXE_brick-initiatord");

const CONFIG: &str =
    "[[volumes]]\nname = \"k\"\nsession = \"s\"\ndevice_path = \"v\"\npaths = [\"10.0.0.1\"]\n";

struct Daemon {
    child: Child,
    dir: PathBuf,
}

impl Daemon {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("brick-initiatord-ctl-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("root")).unwrap();
        std::fs::write(dir.join("initiator.toml"), CONFIG).unwrap();
        let log = std::fs::File::create(dir.join("daemon.log")).unwrap();
        let child = Command::new(DAEMON)
            .arg("--config")
            .arg(dir.join("initiator.toml"))
            .arg("--socket")
            .arg(dir.join("control.sock"))
            .arg("--root")
            .arg(dir.join("root"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let daemon = Self { child, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        while daemon.try_ask(&status(Format::Json)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the daemon did not answer in 20 s:\n{}",
                daemon.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        daemon
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("control.sock")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    fn try_ask(&self, request: &Request) -> std::io::Result<Reply> {
        control::request(&self.socket(), request)
    }

    fn ask(&self, request: &Request) -> Reply {
        self.try_ask(request)
            .unwrap_or_else(|e| panic!("{request:?}: {e}\n{}", self.log()))
    }

    /// The reply line to raw `bytes`.
    fn raw(&self, bytes: &[u8]) -> String {
        let mut stream = UnixStream::connect(self.socket()).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        stream.write_all(bytes).unwrap();
        stream.shutdown(std::net::Shutdown::Write).unwrap();
        let mut line = String::new();
        BufReader::new(&stream).read_line(&mut line).unwrap();
        line
    }

    /// `brick-initiatord ARGS --socket SOCKET`: exit code and stdout.
    fn client(&self, args: &[&str]) -> (i32, String) {
        let output = Command::new(DAEMON)
            .args(args)
            .arg("--socket")
            .arg(self.socket())
            .output()
            .unwrap();
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8(output.stdout).unwrap(),
        )
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn status(format: Format) -> Request {
    Request::Status { format }
}

fn refusal(reply: Reply) -> String {
    match reply {
        Reply::Error { message } => message,
        other => panic!("expected an error reply, found {other:?}"),
    }
}

fn volume(name: &str) -> VolumeSpec {
    VolumeSpec {
        name: name.into(),
        session: "t".into(),
        device_path: "w".into(),
        access_mode: None,
        port: None,
        paths: vec!["10.0.0.1".into()],
    }
}

fn names(daemon: &Daemon) -> Vec<(String, String)> {
    match daemon.ask(&Request::List {
        format: Format::Json,
    }) {
        Reply::List { volumes } => volumes.into_iter().map(|v| (v.name, v.origin)).collect(),
        other => panic!("expected a list reply, found {other:?}"),
    }
}

#[test]
fn typed_requests_over_the_socket() {
    let daemon = Daemon::start();
    let Reply::Status { status: report } = daemon.ask(&status(Format::Json)) else {
        panic!("expected a status reply");
    };
    assert!(!report.converged);
    assert_eq!(
        (
            report.volumes[0].name.as_str(),
            report.volumes[0].origin.as_str()
        ),
        ("k", "config")
    );

    // `brick-initiatord status`: the report as one JSON line, or the table.
    let (code, json) = daemon.client(&["status", "--json"]);
    assert_eq!(code, 0, "{json}");
    assert!(
        json.starts_with("{\"converged\":false,\"volumes\":[{\"name\":\"k\",")
            && json.lines().count() == 1,
        "{json}"
    );
    let (code, table) = daemon.client(&["status"]);
    assert_eq!(code, 0, "{table}");
    assert!(table.starts_with("NAME "), "{table}");
    assert!(
        table.contains("\nk                -          not mapped  missing  s/v"),
        "{table}"
    );
    let Reply::Text { text } = daemon.ask(&Request::List {
        format: Format::Text,
    }) else {
        panic!("expected a text reply");
    };
    assert!(text.contains("\nk                config"), "{text}");

    // Refusals name the field, or say why; nothing is kept.
    let bad = VolumeSpec {
        access_mode: Some("rx".into()),
        ..volume("x")
    };
    assert_eq!(
        refusal(daemon.ask(&Request::Map { volume: bad })),
        "map request: volume.access_mode: expected \"ro\", \"rw\" or \"migration\", found \"rx\""
    );
    let clash = VolumeSpec {
        session: "s".into(),
        device_path: "v".into(),
        ..volume("x")
    };
    let message = refusal(daemon.ask(&Request::Map { volume: clash }));
    assert!(
        message.contains("device_path: \"v\" is already mapped in session \"s\" by volume \"k\""),
        "{message}"
    );
    let message = refusal(daemon.ask(&Request::Unmap {
        name: "k".into(),
        force: true,
    }));
    assert!(message.contains("remove it there and reload"), "{message}");
    assert_eq!(names(&daemon), [("k".to_owned(), "config".to_owned())]);

    // No rnbd client under this root: a good map is kept (and retried),
    // in the state file too, until unmapped.
    let Reply::Mapped { volume: mapped } = daemon.ask(&Request::Map {
        volume: volume("x"),
    }) else {
        panic!("expected a mapped reply:\n{}", daemon.log());
    };
    assert_eq!(
        (mapped.name.as_str(), mapped.origin.as_str(), mapped.device),
        ("x", "runtime", None)
    );
    let state = daemon.dir.join("root/run/brick/initiatord-volumes.toml");
    let kept = std::fs::read_to_string(&state).unwrap();
    assert!(
        kept.contains("name = \"x\"") && kept.contains("session = \"t\""),
        "{kept}"
    );
    assert_eq!(
        names(&daemon),
        [
            ("k".to_owned(), "config".to_owned()),
            ("x".to_owned(), "runtime".to_owned())
        ]
    );
    assert_eq!(
        daemon.ask(&Request::Unmap {
            name: "x".into(),
            force: false,
        }),
        Reply::Unmapped {
            name: "x".into(),
            device: None
        }
    );
    assert!(!std::fs::read_to_string(&state).unwrap().contains("name ="));
    assert_eq!(names(&daemon), [("k".to_owned(), "config".to_owned())]);

    // Lines that are not requests get an error reply; the daemon goes on.
    for (line, expected) in [
        (&b"status\n"[..], "expected one JSON object per line"),
        (
            b"{\"request\":\"frobnicate\"}\n",
            "found unknown request \\\"frobnicate\\\"",
        ),
        (
            b"{\"request\":\"unmap\",\"nme\":\"k\"}\n",
            "unknown field `nme`",
        ),
    ] {
        let reply = daemon.raw(line);
        assert!(
            reply.starts_with("{\"reply\":\"error\",\"message\":") && reply.contains(expected),
            "{reply}"
        );
    }
    let mut long = vec![b' '; 2 * control::MAX_REQUEST_LEN as usize];
    long.push(b'\n');
    let stream = UnixStream::connect(daemon.socket()).unwrap();
    let writer = {
        let mut stream = stream.try_clone().unwrap();
        std::thread::spawn(move || {
            let _ = stream.write_all(&long);
        })
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut reply = String::new();
    BufReader::new(&stream).read_line(&mut reply).unwrap();
    let _ = writer.join();
    assert!(
        reply.contains("expected a request line of at most 65536 bytes"),
        "{reply}"
    );
    assert!(matches!(
        daemon.ask(&status(Format::Text)),
        Reply::Text { .. }
    ));
    assert!(Path::new(&daemon.socket()).exists());
}
