//! How outcomes read: errnos by name, CM refusals, raw answers.

use rtrs::client::PathError;
use verbs::RejectReason;

use crate::clients::{RawOutcome, RawRefusal};

/// An errno by name.
pub fn errno_name(errno: u16) -> String {
    match errno {
        0 => "0".to_string(),
        _ => rtrs::server::errno::Display(errno).to_string(),
    }
}

/// A CONN_RSP errno (negative) by name.
pub fn conn_errno(errno: i16) -> String {
    if errno < 0 {
        format!("-{}", errno_name(errno.unsigned_abs()))
    } else {
        format!("{errno}")
    }
}

pub fn raw_outcome(outcome: RawOutcome) -> String {
    match outcome {
        RawOutcome::Answered(errno) => format!("answered {}", errno_name(errno)),
        RawOutcome::Closed => "path closed".into(),
    }
}

pub fn refusal(result: &Result<(verbs::ConnId, rtrs::wire::ConnRsp), RawRefusal>) -> String {
    match result {
        Ok(_) => "accepted".into(),
        Err(RawRefusal::Rejected(reason, Some(rsp))) => {
            let kind = if *reason == RejectReason::CONSUMER_DEFINED {
                "consumer-defined".to_string()
            } else {
                format!("{reason:?}")
            };
            format!("REJ {kind} {}", conn_errno(rsp.errno))
        }
        Err(RawRefusal::Rejected(reason, None)) => format!("REJ {reason:?} without CONN_RSP"),
        Err(RawRefusal::Unreachable) => "unreachable".into(),
    }
}

pub fn connect_outcome(result: Result<(), PathError>) -> String {
    match result {
        Ok(()) => "session up".into(),
        Err(PathError::Rejected(errno)) => format!("rejected {}", conn_errno(errno)),
        Err(other) => format!("{other:?}"),
    }
}

/// Counts of equal strings, in first-seen order: `"4 accepted, 28 REJ ..."`.
pub fn tally(outcomes: &[String]) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for outcome in outcomes {
        match counts.iter_mut().find(|(o, _)| o == outcome) {
            Some((_, n)) => *n += 1,
            None => counts.push((outcome, 1)),
        }
    }
    counts
        .iter()
        .map(|(o, n)| format!("{n} {o}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The text of a caught panic.
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else {
        "panic".into()
    }
}
