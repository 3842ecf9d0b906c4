//! The ACCESS_RULES and ACCESS_VOLUMES sections: decoding a rule and its
//! volume list, and the questions the target asks of the rules (may this
//! session open this volume, and how; may it connect at all).

use core::net::Ipv4Addr;

use super::{
    error_name, AccessRule, Manifest, ReadError, RuleVolumes, VolumeIndexes, RULE_ALL_VOLUMES,
    RULE_HAS_SOURCE,
};
#[cfg(doc)]
use crate::types::MAX_ACCESS_RULES;
use crate::types::{check_session_pattern, pattern_matches, AccessMode, Ipv4Cidr};

impl<'a> Manifest<'a> {
    pub(super) fn decode_rule(&self, index: usize) -> Result<AccessRule<'a>, ReadError> {
        let r = self.record(self.rules, index);
        let rule = u32::try_from(index).unwrap_or(u32::MAX);
        let sessions = self.checked_text(r.str_ref(0), "access sessions", check_session_pattern)?;
        let source_address = Ipv4Addr::from(r.array::<4>(8));
        let prefix = r.u8(12);
        let flags = r.u8(13);
        let mode_code = r.u8(14);
        if r.u8(15) != 0 || flags & !(RULE_HAS_SOURCE | RULE_ALL_VOLUMES) != 0 {
            return Err(ReadError::ReservedNotZero("access rule bytes"));
        }
        if prefix > 32 {
            return Err(ReadError::BadPrefix(prefix));
        }
        let source = if flags & RULE_HAS_SOURCE != 0 {
            Some(Ipv4Cidr {
                address: source_address,
                prefix,
            })
        } else {
            if prefix != 0 || source_address != Ipv4Addr::UNSPECIFIED {
                return Err(ReadError::ReservedNotZero(
                    "access rule source (flagged absent)",
                ));
            }
            None
        };
        let mode =
            AccessMode::from_code(mode_code).ok_or(ReadError::UnknownAccessMode(mode_code))?;
        let first = usize::try_from(r.u32(16)).unwrap_or(usize::MAX);
        let count = usize::try_from(r.u32(20)).unwrap_or(usize::MAX);
        let volumes = if flags & RULE_ALL_VOLUMES != 0 {
            if first != 0 || count != 0 {
                return Err(ReadError::ReservedNotZero(
                    "access rule volume list (all volumes)",
                ));
            }
            RuleVolumes::All
        } else {
            let bytes = first
                .checked_add(count)
                .filter(|&end| count != 0 && end <= self.rule_volumes.count)
                .and_then(|end| {
                    self.bytes.get(
                        self.rule_volumes.offset + first * 2..self.rule_volumes.offset + end * 2,
                    )
                })
                .ok_or(ReadError::SectionOutOfBounds("access volume list"))?;
            let indexes = VolumeIndexes { bytes };
            for (n, volume) in indexes.enumerate() {
                if volume >= self.volumes.count {
                    return Err(ReadError::VolumeIndexOutOfRange {
                        rule,
                        index: volume as u16,
                    });
                }
                if indexes.take(n).any(|earlier| earlier == volume) {
                    let name = self.decode_volume(volume)?.name;
                    return Err(ReadError::DuplicateRuleVolume {
                        rule,
                        volume: error_name(name),
                    });
                }
            }
            RuleVolumes::Only(indexes)
        };
        Ok(AccessRule {
            sessions,
            source,
            volumes,
            mode,
        })
    }

    /// Number of access rules (1..=[`MAX_ACCESS_RULES`]).
    pub fn access_rule_count(&self) -> usize {
        self.rules.count
    }

    /// The access rules, in manifest order.
    pub fn access_rules(&self) -> impl Iterator<Item = AccessRule<'a>> + '_ {
        (0..self.rules.count).filter_map(|i| self.decode_rule(i).ok())
    }

    /// The most `session` from `source` may do with volume `volume_index`:
    /// read-write if any matching rule grants it, read-only if only
    /// read-only rules match, `None` if no rule matches (refuse the OPEN).
    pub fn access(
        &self,
        session: &str,
        source: Ipv4Addr,
        volume_index: usize,
    ) -> Option<AccessMode> {
        let mut best = None;
        for rule in self.access_rules() {
            if rule.matches(session, source, volume_index) {
                if rule.mode == AccessMode::ReadWrite {
                    return Some(AccessMode::ReadWrite);
                }
                best = Some(rule.mode);
            }
        }
        best
    }

    /// True if some rule lets `session` from `source` open anything at all
    /// (check at session establishment, before any OPEN).
    pub fn admits(&self, session: &str, source: Ipv4Addr) -> bool {
        self.access_rules().any(|rule| {
            pattern_matches(rule.sessions, session)
                && rule.source.is_none_or(|net| net.contains(source))
        })
    }
}
