//! ICMP echo: a peer can `ping` an interface address; the engine answers
//! without the HCA, one reply held per interface.

/// Frames of ICMP echo replies held per interface.
pub(crate) const ICMP_REPLY_LEN: usize = 1514;

pub(crate) fn is_icmp(frame: &[u8]) -> bool {
    frame.get(12..14) == Some(&[0x08, 0x00]) && frame.get(23) == Some(&1)
}

pub(crate) fn checksum(bytes: &[u8]) -> u16 {
    let mut sum = 0u32;
    for chunk in bytes.chunks(2) {
        let word = u16::from_be_bytes([chunk[0], chunk.get(1).copied().unwrap_or(0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Writes into `out` the echo reply to `frame` if it is an ICMP echo
/// request to `ip` (no IP options, not fragmented, valid lengths) and
/// returns its length; `None` for anything else.
pub fn icmp_echo_reply(frame: &[u8], ip: [u8; 4], out: &mut [u8]) -> Option<usize> {
    let ip_header = frame.get(14..34)?;
    if frame.get(12..14)? != [0x08, 0x00] || ip_header[0] != 0x45 || ip_header[9] != 1 {
        return None;
    }
    if ip_header[16..20] != ip || ip_header[6] & 0x3f != 0 || ip_header[7] != 0 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([ip_header[2], ip_header[3]]));
    let icmp = frame.get(34..14 + total)?;
    if total < 28 || icmp[0] != 8 || icmp[1] != 0 {
        return None;
    }
    let len = 14 + total;
    let reply = out.get_mut(..len)?;
    reply.copy_from_slice(&frame[..len]);
    reply.copy_within(6..12, 0);
    reply[6..12].copy_from_slice(&frame[0..6]);
    reply[20..22].fill(0);
    reply[22] = 64;
    reply[26..30].copy_from_slice(&ip);
    reply[30..34].copy_from_slice(&ip_header[12..16]);
    reply[24..26].fill(0);
    let ip_sum = checksum(&reply[14..34]);
    reply[24..26].copy_from_slice(&ip_sum.to_be_bytes());
    reply[34] = 0;
    reply[36..38].fill(0);
    let icmp_sum = checksum(&reply[34..]);
    reply[36..38].copy_from_slice(&icmp_sum.to_be_bytes());
    Some(len)
}
