//! `brick status|list|map|unmap` against a stand-in daemon: the typed
//! request each command sends, and what it prints from each reply (the
//! `--json` lines are what the VM cases' scripts grep).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use control::{
    ControlServer, ExportStatus, Format, ListEntry, PathStatus, Reply, Request, Status, VolumeSpec,
    VolumeStatus,
};

/// A control socket answering from a script, recording what it was asked.
struct StandIn {
    socket: PathBuf,
    asked: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StandIn {
    fn start(tag: &str, answer: fn(&Request) -> Reply) -> Self {
        let socket =
            std::env::temp_dir().join(format!("brick-cli-{tag}-{}.sock", std::process::id()));
        let server = ControlServer::bind(&socket).unwrap();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (asked, stop) = (asked.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    server.poll(&mut |request| {
                        let reply = answer(&request);
                        asked.lock().unwrap().push(request);
                        reply
                    });
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        Self {
            socket,
            asked,
            stop,
            thread: Some(thread),
        }
    }

    /// Runs `brick ARGS --socket SOCKET`.
    fn brick(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_brick"))
            .args(args)
            .arg("--socket")
            .arg(&self.socket)
            .output()
            .unwrap()
    }

    /// What was asked since the last call.
    fn asked(&self) -> Vec<Request> {
        std::mem::take(&mut *self.asked.lock().unwrap())
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn entry(name: &str, origin: &str) -> ListEntry {
    ListEntry {
        name: name.into(),
        origin: origin.into(),
        session: "bm".into(),
        device_path: "vol1".into(),
        access_mode: "rw".into(),
        device: Some("rnbd1".into()),
        state: "open".into(),
    }
}

/// The stand-in's answers: what a daemon with volume `a` (config) and `x`
/// (run time) would say.
fn daemon(request: &Request) -> Reply {
    match request {
        Request::Status {
            format: Format::Json,
        } => Reply::Status {
            status: Status {
                converged: true,
                volumes: vec![VolumeStatus {
                    name: "a".into(),
                    session: "bm".into(),
                    device_path: "vol0".into(),
                    origin: "config".into(),
                    device: Some("rnbd0".into()),
                    state: "open".into(),
                    linked: true,
                    paths: vec![PathStatus {
                        path: "ip:10.77.0.2@ip:10.77.0.1".into(),
                        connected: true,
                    }],
                }],
                exports: Vec::<ExportStatus>::new(),
                notices: Vec::new(),
            },
        },
        Request::Status {
            format: Format::Text,
        } => Reply::Text {
            text: "NAME DEVICE\na    rnbd0".into(),
        },
        Request::List {
            format: Format::Json,
        } => Reply::List {
            volumes: vec![entry("a", "config"), entry("x", "runtime")],
        },
        Request::List {
            format: Format::Text,
        } => Reply::Text {
            text: "NAME ORIGIN\nx    runtime".into(),
        },
        Request::Map { volume } if volume.name == "y" => Reply::error(
            "volume \"y\": device_path: \"vol1\" is already mapped in session \"bm\" by volume \"x\" (line 1)",
        ),
        Request::Map { volume } => Reply::Mapped {
            volume: entry(&volume.name, "runtime"),
        },
        Request::Unmap { name, .. } if name == "a" => Reply::error(
            "volume \"a\" is in the config file /etc/brick/initiator.toml (line 1): remove it there and reload (SIGHUP)",
        ),
        Request::Unmap { name, .. } => Reply::Unmapped {
            name: name.clone(),
            device: Some("rnbd1".into()),
        },
    }
}

#[test]
fn status_and_list_print_the_reply() {
    let standin = StandIn::start("show", daemon);
    let json = stdout(&standin.brick(&["status", "--json"]));
    assert!(
        json.starts_with("{\"converged\":true,\"volumes\":[{\"name\":\"a\",")
            && json.ends_with("}\n")
            && json.lines().count() == 1,
        "{json}"
    );
    let text = stdout(&standin.brick(&["status"]));
    assert_eq!(text, "NAME DEVICE\na    rnbd0\n");
    let list = stdout(&standin.brick(&["list", "--json"]));
    assert!(
        list.starts_with("[{\"name\":\"a\",\"origin\":\"config\"")
            && list.contains("{\"name\":\"x\",\"origin\":\"runtime\"")
            && list.lines().count() == 1,
        "{list}"
    );
    assert_eq!(
        stdout(&standin.brick(&["list"])),
        "NAME ORIGIN\nx    runtime\n"
    );
    assert_eq!(
        standin.asked(),
        [
            Request::Status {
                format: Format::Json
            },
            Request::Status {
                format: Format::Text
            },
            Request::List {
                format: Format::Json
            },
            Request::List {
                format: Format::Text
            },
        ]
    );
}

#[test]
fn map_and_unmap_send_typed_requests() {
    let standin = StandIn::start("map", daemon);
    let out = stdout(&standin.brick(&[
        "map",
        "x",
        "--session",
        "bm",
        "--device-path",
        "vol1",
        "--path",
        "10.77.0.1",
        "--path",
        "10.78.0.2@10.78.0.1",
        "--port",
        "1235",
    ]));
    assert_eq!(out, "x: rnbd1 (open), /dev/brick/x\n");

    let dir = std::env::temp_dir().join(format!("brick-cli-mapfile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("z.toml");
    std::fs::write(
        &file,
        "[[volumes]]\nname = \"z\"\nsession = \"bm\"\ndevice_path = \"vol2\"\naccess_mode = \"ro\"\npaths = [\"10.77.0.1\"]\n",
    )
    .unwrap();
    let out = stdout(&standin.brick(&["map", "--file", path(&file)]));
    assert_eq!(out, "z: rnbd1 (open), /dev/brick/z\n");

    // A refusal: exit status 1, the daemon's message on stderr.
    let refused = standin.brick(&[
        "map",
        "y",
        "--session",
        "bm",
        "--device-path",
        "vol1",
        "--path",
        "10.77.0.1",
    ]);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains(
            "the daemon refused: volume \"y\": device_path: \"vol1\" is already mapped in session"
        ),
        "{stderr}"
    );

    assert_eq!(
        stdout(&standin.brick(&["unmap", "x", "--force"])),
        "x: unmapped\n"
    );
    let refused = standin.brick(&["unmap", "a"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("remove it there and reload"));

    let spec = |name: &str, device_path: &str| VolumeSpec {
        name: name.into(),
        session: "bm".into(),
        device_path: device_path.into(),
        access_mode: None,
        port: None,
        paths: vec!["10.77.0.1".into()],
    };
    assert_eq!(
        standin.asked(),
        [
            Request::Map {
                volume: VolumeSpec {
                    port: Some(1235),
                    paths: vec!["10.77.0.1".into(), "10.78.0.2@10.78.0.1".into()],
                    ..spec("x", "vol1")
                }
            },
            Request::Map {
                volume: VolumeSpec {
                    access_mode: Some("ro".into()),
                    ..spec("z", "vol2")
                }
            },
            Request::Map {
                volume: spec("y", "vol1")
            },
            Request::Unmap {
                name: "x".into(),
                force: true
            },
            Request::Unmap {
                name: "a".into(),
                force: false
            },
        ]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn no_daemon_is_an_error_naming_the_socket() {
    let socket = std::env::temp_dir().join(format!("brick-cli-none-{}.sock", std::process::id()));
    let output = Command::new(env!("CARGO_BIN_EXE_brick"))
        .args(["status", "--socket", path(&socket)])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "no brick-initiatord answers on {}",
            socket.display()
        )),
        "{stderr}"
    );
}

fn path(path: &Path) -> &str {
    path.to_str().unwrap()
}
