//! RFC 1624 incremental checksum updates (HC' = ~(~HC + ~m + m')), for XDP programs, which
//! have no checksum helpers. Packets there carry complete checksums: an XDP program sees
//! frames as they arrived from a wire (see the accelerated mode's note in ARCHITECTURE.md).

#[inline(always)]
fn fold(mut s: u32) -> u16 {
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    s as u16
}

/// The checksum `csum` (as stored) after a 16-bit field changed from `old` to `new` (both as
/// stored: the sum is byte-order independent when every value is taken in the same order).
#[inline(always)]
pub fn replace2(csum: u16, old: u16, new: u16) -> u16 {
    let s = (!csum as u32) + (!old as u32 & 0xffff) + new as u32;
    !fold(s)
}

/// As [`replace2`] for a 32-bit field (an address), as its two 16-bit halves.
#[inline(always)]
pub fn replace4(csum: u16, old: u32, new: u32) -> u16 {
    let c = replace2(csum, old as u16, new as u16);
    replace2(c, (old >> 16) as u16, (new >> 16) as u16)
}
