//! The engine built from `examples/two-ram-volumes.toml`: it boots, listens,
//! answers ARP and ICMP echo for its address, prints statistics, idles with
//! no timed work, and refuses manifests it cannot serve.

use manifest::binary::Manifest;
use target_image::{BuildError, Engine};
use verbs::KeySource;

struct Keys(u32);

impl KeySource for Keys {
    fn next_u32(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        self.0
    }
}

const PEER_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x77, 0x00, 0x02];
const PEER_IP: [u8; 4] = [10, 77, 0, 2];
const OUR_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x77, 0x00, 0x01];
const OUR_IP: [u8; 4] = [10, 77, 0, 1];

fn example() -> Vec<u8> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/two-ram-volumes.toml"
    );
    manifest::compile_file(std::path::Path::new(path))
        .expect("example manifest")
        .to_binary()
        .unwrap()
}

fn arp_request() -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&PEER_MAC);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&PEER_MAC);
    f.extend_from_slice(&PEER_IP);
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&OUR_IP);
    f.resize(60, 0);
    f
}

fn checksum(bytes: &[u8]) -> u16 {
    let mut sum = 0u32;
    for c in bytes.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn echo_request() -> Vec<u8> {
    let mut f = OUR_MAC.to_vec();
    f.extend_from_slice(&PEER_MAC);
    f.extend_from_slice(&[0x08, 0x00]);
    let mut ip = vec![0x45, 0, 0, 36, 0, 1, 0x40, 0, 64, 1, 0, 0];
    ip.extend_from_slice(&PEER_IP);
    ip.extend_from_slice(&OUR_IP);
    let sum = checksum(&ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&ip);
    let mut icmp = vec![8, 0, 0, 0, 0x12, 0x34, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8];
    let sum = checksum(&icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&icmp);
    f
}

/// Runs `f` on a thread with room for the HCA built on the stack before it
/// is boxed (the engine's HCAs are large inline tables).
fn big_stack(f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn boots_answers_arp_and_ping_and_idles() {
    big_stack(boot);
}

fn boot() {
    let blob = example();
    let manifest = Manifest::parse(&blob).unwrap();
    let mut engine = Engine::new(manifest, |_| Keys(9)).expect("engine");
    assert_eq!(engine.interface_count(), 1);
    assert!(engine.rtrs(0).unwrap().is_listening());

    let mut out: Vec<(usize, Vec<u8>)> = Vec::new();
    let mut sink = |i: usize, h: &[u8], p: &[&[u8]], t: &[u8]| {
        let mut f = h.to_vec();
        p.iter().for_each(|x| f.extend_from_slice(x));
        f.extend_from_slice(t);
        out.push((i, f));
    };
    engine.poll(1_000, &mut sink);
    // Nothing to do: no deadline (no paths), so the loop may block.
    assert_eq!(engine.poll_at(2_000), None);

    engine.receive(0, 2_000, &arp_request());
    engine.receive(0, 2_000, &echo_request());
    while engine.poll(3_000, &mut sink) {}
    // A broadcast who-has: a broadcast reply now, a unicast one once the
    // ARP confirm delay has passed (roce::arp).
    let arp = out
        .iter()
        .find(|(_, f)| f[12..14] == [0x08, 0x06])
        .expect("ARP reply");
    assert_eq!(arp.1[0..6], [0xff; 6]);
    assert_eq!(arp.1[20..22], [0, 2]); // reply
    assert_eq!(arp.1[22..28], OUR_MAC);
    assert_eq!(arp.1[32..38], PEER_MAC);
    let echo = out
        .iter()
        .find(|(_, f)| f[12..14] == [0x08, 0x00] && f[23] == 1)
        .expect("echo reply");
    assert_eq!(echo.1[34], 0); // echo reply
    assert_eq!(echo.1[30..34], PEER_IP);
    assert_eq!(checksum(&echo.1[14..34]), 0);
    assert_eq!(checksum(&echo.1[34..]), 0);
    let later = 3_000 + roce::arp::Config::default().confirm_delay;
    assert!(engine.poll_at(3_000).is_some_and(|at| at <= later));
    let mut later_out: Vec<Vec<u8>> = Vec::new();
    while engine.poll(later, &mut |_: usize, h: &[u8], p: &[&[u8]], t: &[u8]| {
        let mut f = h.to_vec();
        p.iter().for_each(|x| f.extend_from_slice(x));
        f.extend_from_slice(t);
        later_out.push(f);
    }) {}
    let unicast = later_out
        .iter()
        .find(|f| f[12..14] == [0x08, 0x06])
        .expect("unicast ARP reply");
    assert_eq!(unicast[0..6], PEER_MAC);
    assert_eq!(unicast[20..22], [0, 2]);
    assert_eq!(unicast[22..28], OUR_MAC);

    let stats = engine.stats().to_string();
    assert!(stats.contains("interface eth0 10.77.0.1"), "{stats}");
    assert!(stats.contains("volume vol0 (268435456 B)"), "{stats}");
    assert!(stats.contains("volume vol1"), "{stats}");
    engine.close_all(4_000);
    assert!(engine.is_quiet());
}

#[test]
fn refuses_volume_kinds_it_cannot_serve() {
    big_stack(refuse_file);
}

fn refuse_file() {
    let source = r#"
[target]
name = "t"
[[interfaces]]
name = "eth0"
mac = "52:54:00:77:00:01"
address = "10.77.0.1/24"
[[volumes]]
name = "f"
kind = "file"
path = "/tmp/brick-never-created.img"
size = "1MiB"
[[access]]
sessions = "*"
volumes = "*"
mode = "rw"
"#;
    let blob = manifest::build(source, "t.toml").expect("manifest");
    let manifest = Manifest::parse(&blob).unwrap();
    let result = Engine::new(manifest, |_| Keys(1)).map(|_| ());
    match result {
        Err(BuildError::Volume(name, why)) => {
            assert_eq!(name, "f");
            assert!(why.contains("RAM only"), "{why}");
        }
        Err(other) => panic!("unexpected {other}"),
        Ok(()) => panic!("a file volume was accepted"),
    }
}
