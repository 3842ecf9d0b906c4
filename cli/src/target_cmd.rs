//! `brick target status|extents --admin ADDR`: a running `brick-target`'s
//! admin endpoint (docs/ADMIN.md) read over HTTP: `/metrics` summarised
//! per volume, session, path and interface, and a thin volume's extents.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde_json::{json, Map, Value};

/// `brick target` subcommands.
#[derive(Subcommand, Debug)]
pub enum TargetCommand {
    /// Summarise a target's /metrics: volumes, sessions, paths,
    /// interfaces, refusals.
    #[command(after_help = "Example:\n  brick target status --admin 127.0.0.1:9100")]
    Status(StatusArgs),
    /// List the allocated extents of a thin volume.
    #[command(
        after_help = "Example:\n  brick target extents --admin 127.0.0.1:9100 --volume thin0"
    )]
    Extents(ExtentsArgs),
}

/// `brick target status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The admin endpoint, IP:PORT (the manifest's `[admin] address`).
    #[arg(long)]
    admin: String,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// `brick target extents`.
#[derive(Args, Debug)]
pub struct ExtentsArgs {
    /// The admin endpoint, IP:PORT.
    #[arg(long)]
    admin: String,
    /// The thin volume's name.
    #[arg(long)]
    volume: String,
    /// The endpoint's JSON as is.
    #[arg(long)]
    json: bool,
}

/// Runs a `brick target` subcommand.
///
/// # Errors
/// The endpoint cannot be reached, answers with an error, or its answer
/// does not parse.
pub fn run(command: &TargetCommand) -> Result<()> {
    match command {
        TargetCommand::Status(args) => status(args),
        TargetCommand::Extents(args) => extents(args),
    }
}

/// `GET path` from `admin`: status code and body.
fn get(admin: &str, path: &str) -> Result<(u16, String)> {
    let address = admin.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = TcpStream::connect(address)
        .with_context(|| format!("connect to the admin endpoint {address}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(15)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .with_context(|| format!("read the answer to GET {path} from {address}"))?;
    let text = String::from_utf8(answer).context("the answer is not UTF-8")?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("GET {path}: expected an HTTP answer, found {} bytes without a header end (is {address} an admin endpoint, and are we an admin source?)", text.len()))?;
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .with_context(|| {
            format!(
                "GET {path}: expected an HTTP status line, found {:?}",
                head.lines().next()
            )
        })?;
    Ok((code, body.to_owned()))
}

/// One sample of the exposition: name, labels, value.
pub struct Sample {
    /// The metric name.
    pub name: String,
    /// Its labels, by name.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// The samples of a Prometheus text exposition (comments skipped).
///
/// # Errors
/// A line that is not `name{labels} value`.
pub fn parse_exposition(text: &str) -> Result<Vec<Sample>> {
    let mut samples = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line
            .rsplit_once(' ')
            .with_context(|| format!("expected `name{{labels}} value`, found {line:?}"))?;
        let value = match value {
            "+Inf" => f64::INFINITY,
            v => v
                .parse()
                .with_context(|| format!("bad value in {line:?}"))?,
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}').unwrap_or(rest))),
            None => (series, BTreeMap::new()),
        };
        samples.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    Ok(samples)
}

/// `a="x",b="y\"z"` as a map (escapes undone).
fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while let Some((name, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next().map(|(_, c)| c) {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => {}
                },
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.insert(name.trim_start_matches(',').to_owned(), value);
        rest = &after[end..];
    }
    labels
}

/// The samples grouped: per volume, session, path and interface (objects
/// of the metric names less their prefix), and the target-wide ones.
pub fn summarise(samples: &[Sample]) -> Value {
    let mut groups: BTreeMap<&str, BTreeMap<String, Map<String, Value>>> = BTreeMap::new();
    let mut target = Map::new();
    let mut refusals = Map::new();
    for s in samples {
        if s.name.ends_with("_bucket") {
            continue;
        }
        let (group, prefix, key_labels): (&str, &str, &[&str]) =
            if s.name.starts_with("brick_volume_") {
                ("volumes", "brick_volume_", &["volume"])
            } else if s.name.starts_with("brick_session_") {
                ("sessions", "brick_session_", &["session", "id"])
            } else if s.name.starts_with("brick_path_") {
                ("paths", "brick_path_", &["session", "id", "path"])
            } else if s.name.starts_with("brick_interface_") {
                ("interfaces", "brick_interface_", &["interface"])
            } else if s.name == "brick_refusals_total" {
                let reason = s.labels.get("reason").cloned().unwrap_or_default();
                refusals.insert(reason, json!(s.value));
                continue;
            } else {
                target.insert(
                    s.name.trim_start_matches("brick_").to_owned(),
                    json!(s.value),
                );
                continue;
            };
        let key: Vec<&str> = key_labels
            .iter()
            .map(|l| s.labels.get(*l).map_or("", String::as_str))
            .collect();
        let entry = groups
            .entry(group)
            .or_default()
            .entry(key.join("/"))
            .or_default();
        for (label, value) in &s.labels {
            entry.insert(label.clone(), json!(value));
        }
        entry.insert(s.name.trim_start_matches(prefix).to_owned(), json!(s.value));
    }
    let mut out = Map::new();
    out.insert("target".into(), Value::Object(target));
    for group in ["volumes", "sessions", "paths", "interfaces"] {
        let list = groups
            .remove(group)
            .unwrap_or_default()
            .into_values()
            .map(Value::Object)
            .collect();
        out.insert(group.into(), Value::Array(list));
    }
    out.insert("refusals".into(), Value::Object(refusals));
    Value::Object(out)
}

fn status(args: &StatusArgs) -> Result<()> {
    let (code, body) = get(&args.admin, "/metrics")?;
    if code != 200 {
        bail!(
            "GET /metrics from {}: expected 200, found {code}: {body}",
            args.admin
        );
    }
    let summary = summarise(&parse_exposition(&body)?);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(());
    }
    print!("{}", render(&summary));
    Ok(())
}

/// The text summary of [`summarise`]'s object.
pub fn render(summary: &Value) -> String {
    let n = |v: &Value, key: &str| v.get(key).and_then(Value::as_f64).unwrap_or(0.0);
    let s = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).unwrap_or("?").to_owned();
    let list = |key: &str| {
        summary
            .get(key)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let t = &summary["target"];
    let mut out = format!(
        "target: {} sessions, {} paths, {} IO answered, {} RTRS connects accepted\n",
        n(t, "sessions"),
        n(t, "paths"),
        n(t, "io_answered_total"),
        n(t, "rtrs_accepted_total")
    );
    for v in list("volumes") {
        let count = n(&v, "latency_seconds_count");
        let mean = if count > 0.0 {
            n(&v, "latency_seconds_sum") / count * 1e6
        } else {
            0.0
        };
        out += &format!(
            "volume {}: reads {} ({} B) writes {} ({} B) errors {} in flight {}, latency mean {mean:.0} µs over {count}",
            s(&v, "volume"),
            n(&v, "reads_total"),
            n(&v, "read_bytes_total"),
            n(&v, "writes_total"),
            n(&v, "written_bytes_total"),
            n(&v, "errors_total"),
            n(&v, "in_flight"),
        );
        if v.get("allocated_extents").is_some() {
            out += &format!(
                "; thin: {} extents allocated, pool {} of {} free",
                n(&v, "allocated_extents"),
                n(&v, "pool_free_extents"),
                n(&v, "pool_extents")
            );
        }
        out.push('\n');
    }
    let paths = list("paths");
    for v in list("sessions") {
        out += &format!(
            "session {} (id {}) from {}: {}, reads {} writes {} errors {} reconnects {}\n",
            s(&v, "session"),
            s(&v, "id"),
            s(&v, "source"),
            if n(&v, "up") > 0.0 {
                "open"
            } else {
                "closed, draining"
            },
            n(&v, "reads_total"),
            n(&v, "writes_total"),
            n(&v, "errors_total"),
            n(&v, "reconnects_total")
        );
        for p in paths
            .iter()
            .filter(|p| p["session"] == v["session"] && p["id"] == v["id"])
        {
            out += &format!(
                "  path {} on {} from {}: reads {} writes {} errors {}\n",
                s(p, "path"),
                s(p, "interface"),
                s(p, "client"),
                n(p, "reads_total"),
                n(p, "writes_total"),
                n(p, "errors_total")
            );
        }
    }
    for v in list("interfaces") {
        out += &format!(
            "interface {} {}: frames in {} out {}, drops checksum {} malformed {}, retransmissions {}, naks sent {} received {}\n",
            s(&v, "interface"),
            s(&v, "address"),
            n(&v, "frames_received_total"),
            n(&v, "frames_sent_total"),
            n(&v, "drops_checksum_total"),
            n(&v, "drops_malformed_total"),
            n(&v, "retransmissions_total"),
            n(&v, "naks_sent_total"),
            n(&v, "naks_received_total")
        );
    }
    let refused: Vec<String> = summary["refusals"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(_, v)| v.as_f64().is_some_and(|v| v > 0.0))
                .map(|(k, v)| format!("{k} {}", v.as_f64().unwrap_or(0.0)))
                .collect()
        })
        .unwrap_or_default();
    out += &format!(
        "refusals: {}; admin connections refused {}\n",
        if refused.is_empty() {
            "none".to_owned()
        } else {
            refused.join(", ")
        },
        n(t, "admin_connections_refused_total")
    );
    out
}

fn extents(args: &ExtentsArgs) -> Result<()> {
    let path = format!("/volumes/{}/extents", args.volume);
    let (code, body) = get(&args.admin, &path)?;
    let value: Value = serde_json::from_str(&body)
        .with_context(|| format!("GET {path}: expected JSON, found {body:?}"))?;
    if code != 200 {
        let error = value.get("error").and_then(Value::as_str).unwrap_or(&body);
        bail!("GET {path} from {}: {code}: {error}", args.admin);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    let n = |key: &str| value.get(key).and_then(Value::as_u64).unwrap_or(0);
    println!(
        "volume {}: {} extents of {} bytes allocated; pool {} of {} extents free",
        args.volume,
        n("allocated_extents"),
        n("extent_size"),
        n("pool_free_extents"),
        n("pool_extents")
    );
    for range in value["ranges"].as_array().into_iter().flatten() {
        let first = range["first_extent"].as_u64().unwrap_or(0);
        let count = range["extents"].as_u64().unwrap_or(0);
        println!(
            "  extents {first}..={} (bytes {}..{})",
            first + count.saturating_sub(1),
            range["offset"].as_u64().unwrap_or(0),
            range["offset"].as_u64().unwrap_or(0) + range["length"].as_u64().unwrap_or(0)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP brick_sessions S.\n# TYPE brick_sessions gauge\nbrick_sessions 1\n\
        brick_volume_reads_total{volume=\"v0\"} 5\n\
        brick_volume_latency_seconds_bucket{volume=\"v0\",le=\"+Inf\"} 5\n\
        brick_volume_latency_seconds_count{volume=\"v0\"} 5\n\
        brick_volume_latency_seconds_sum{volume=\"v0\"} 0.005\n\
        brick_session_up{session=\"a\\\"b\",id=\"3\",source=\"127.0.0.2\"} 1\n\
        brick_path_reads_total{session=\"a\\\"b\",id=\"3\",source=\"127.0.0.2\",path=\"0\",interface=\"lo\",client=\"127.0.0.2\"} 5\n\
        brick_refusals_total{reason=\"rnbd_access_denied\"} 2\n";

    #[test]
    fn the_exposition_parses_and_groups_by_volume_session_and_path() {
        let samples = parse_exposition(TEXT).unwrap();
        assert_eq!(samples.len(), 8);
        assert_eq!(samples[2].value, f64::INFINITY.min(5.0));
        assert_eq!(samples[5].labels["session"], "a\"b", "escapes undone");
        let summary = summarise(&samples);
        assert_eq!(summary["target"]["sessions"], json!(1.0));
        assert_eq!(summary["volumes"][0]["reads_total"], json!(5.0));
        assert_eq!(summary["volumes"][0]["latency_seconds_count"], json!(5.0));
        assert_eq!(summary["sessions"][0]["up"], json!(1.0));
        assert_eq!(summary["paths"][0]["interface"], json!("lo"));
        assert_eq!(summary["refusals"]["rnbd_access_denied"], json!(2.0));
        let text = render(&summary);
        assert!(text.contains("volume v0: reads 5"), "{text}");
        assert!(text.contains("latency mean 1000 µs over 5"), "{text}");
        assert!(
            text.contains("session a\"b (id 3) from 127.0.0.2: open"),
            "{text}"
        );
        assert!(
            text.contains("  path 0 on lo from 127.0.0.2: reads 5"),
            "{text}"
        );
        assert!(text.contains("refusals: rnbd_access_denied 2;"), "{text}");
        assert!(parse_exposition("no_value_here").is_err());
    }
}
