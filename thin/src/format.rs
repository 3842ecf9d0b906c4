//! The on-disk format (docs/THIN.md): the pool layout, the superblock and
//! the map blocks, each a 4 KiB block with a version, a sequence number and
//! a CRC-32 of its own bytes.
//!
//! Every metadata block exists twice (copy A and copy B). A write goes to
//! the copy that does *not* hold the newest valid version, with the
//! sequence number one higher, so a torn or lost write leaves the previous
//! version readable in the other copy. Reading picks the valid copy with
//! the higher sequence number; a copy of all zeroes is "never written".

/// Bytes of every metadata block.
pub const BLOCK: usize = 4096;
/// The default extent: 2 MiB.
pub const DEFAULT_EXTENT: u32 = 2 << 20;
/// The format version this crate writes and reads.
pub const VERSION: u32 = 1;
/// Volumes one pool can hold (entries of the superblock's volume table).
pub const MAX_VOLUMES: usize = 50;
/// Longest volume name in the volume table, in bytes (a manifest name).
pub const MAX_NAME: usize = 64;
/// Map entries per map block.
pub const ENTRIES_PER_BLOCK: u32 = ((BLOCK - MAP_HEADER) / ENTRY) as u32;

const SUPER_MAGIC: &[u8; 8] = b"BRICKTHN";
const MAP_MAGIC: &[u8; 4] = b"BTMP";
const SUPER_HEADER: usize = 64;
const VOLUME_ENTRY: usize = 80;
const MAP_HEADER: usize = 32;
const ENTRY: usize = 16;
/// Offset of the CRC field in both block kinds.
const SUPER_CRC: usize = 12;
const MAP_CRC: usize = 4;

/// Where everything is in a pool of a given size (all byte offsets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Extent size in bytes.
    pub extent_size: u32,
    /// Data extents.
    pub extent_count: u32,
    /// Map blocks (each stored twice).
    pub map_blocks: u32,
    /// Byte offset of extent 0 (a multiple of the extent size).
    pub data_start: u64,
}

impl Layout {
    /// The layout for a pool of `pool_size` bytes: superblock copies at
    /// 0 and 4 KiB, map copy A from 8 KiB, copy B after it, data from the
    /// next extent boundary. `None` if not one extent fits.
    pub fn for_pool(pool_size: u64, extent_size: u32) -> Option<Self> {
        let extent = u64::from(extent_size);
        if extent_size == 0 || extent % BLOCK as u64 != 0 {
            return None;
        }
        let mut count = pool_size / extent;
        loop {
            let count32 = u32::try_from(count).ok()?;
            let map_blocks = count32.div_ceil(ENTRIES_PER_BLOCK).max(1);
            let meta = 2 * BLOCK as u64 + 2 * u64::from(map_blocks) * BLOCK as u64;
            let data_start = meta.next_multiple_of(extent);
            let fits = pool_size.saturating_sub(data_start) / extent;
            if fits >= count {
                return (count > 0).then_some(Self {
                    extent_size,
                    extent_count: count32,
                    map_blocks,
                    data_start,
                });
            }
            count = fits;
        }
    }

    /// Byte offset of superblock copy `copy` (0 or 1).
    pub fn super_offset(copy: u64) -> u64 {
        copy * BLOCK as u64
    }

    /// Byte offset of copy `copy` (0 or 1) of map block `block`.
    pub fn map_offset(&self, block: u32, copy: u64) -> u64 {
        2 * BLOCK as u64 + (copy * u64::from(self.map_blocks) + u64::from(block)) * BLOCK as u64
    }

    /// Byte offset of extent `extent`.
    pub fn extent_offset(&self, extent: u32) -> u64 {
        self.data_start + u64::from(extent) * u64::from(self.extent_size)
    }
}

/// One volume of the superblock's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VolumeEntry {
    name: [u8; MAX_NAME],
    name_len: u8,
    /// Virtual size in bytes.
    pub size: u64,
}

impl VolumeEntry {
    /// An entry for `name` (at most [`MAX_NAME`] bytes) of `size` bytes.
    pub fn new(name: &str, size: u64) -> Option<Self> {
        let bytes = name.as_bytes();
        if bytes.is_empty() || bytes.len() > MAX_NAME {
            return None;
        }
        let mut entry = Self {
            name: [0; MAX_NAME],
            name_len: bytes.len() as u8,
            size,
        };
        entry.name[..bytes.len()].copy_from_slice(bytes);
        Some(entry)
    }

    /// The name's bytes.
    pub fn name(&self) -> &[u8] {
        &self.name[..usize::from(self.name_len)]
    }
}

/// The superblock: layout, and the volumes that own extents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// Sequence number of this version (higher is newer).
    pub seq: u64,
    /// Pool size the layout was made for.
    pub pool_size: u64,
    /// The layout.
    pub layout: Layout,
    /// The volume table; a map entry names a volume by its index + 1.
    pub volumes: heapless::Vec<VolumeEntry, MAX_VOLUMES>,
}

/// Why a metadata block did not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// All zeroes: never written.
    Blank,
    /// Wrong magic, checksum, version or fields: torn or foreign.
    Corrupt(&'static str),
}

fn le32(block: &[u8], at: usize) -> u32 {
    let mut bytes = [0; 4];
    bytes.copy_from_slice(&block[at..at + 4]);
    u32::from_le_bytes(bytes)
}

fn le64(block: &[u8], at: usize) -> u64 {
    let mut bytes = [0; 8];
    bytes.copy_from_slice(&block[at..at + 8]);
    u64::from_le_bytes(bytes)
}

fn checksum(block: &[u8], crc_at: usize) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&block[..crc_at]);
    hasher.update(&[0; 4]);
    hasher.update(&block[crc_at + 4..BLOCK]);
    hasher.finalize()
}

fn check_block(block: &[u8], magic: &[u8], crc_at: usize) -> Result<(), Invalid> {
    if block.len() < BLOCK {
        return Err(Invalid::Corrupt("short block"));
    }
    if block[..BLOCK].iter().all(|&b| b == 0) {
        return Err(Invalid::Blank);
    }
    if &block[..magic.len()] != magic {
        return Err(Invalid::Corrupt("bad magic"));
    }
    if le32(block, crc_at) != checksum(block, crc_at) {
        return Err(Invalid::Corrupt("checksum mismatch"));
    }
    Ok(())
}

impl Superblock {
    /// Encodes into `block` (at least [`BLOCK`] bytes).
    pub fn encode(&self, block: &mut [u8]) {
        let block = &mut block[..BLOCK];
        block.fill(0);
        block[..8].copy_from_slice(SUPER_MAGIC);
        block[8..12].copy_from_slice(&VERSION.to_le_bytes());
        block[16..24].copy_from_slice(&self.seq.to_le_bytes());
        block[24..28].copy_from_slice(&self.layout.extent_size.to_le_bytes());
        block[28..32].copy_from_slice(&(BLOCK as u32).to_le_bytes());
        block[32..40].copy_from_slice(&self.pool_size.to_le_bytes());
        block[40..44].copy_from_slice(&self.layout.extent_count.to_le_bytes());
        block[44..48].copy_from_slice(&self.layout.map_blocks.to_le_bytes());
        block[48..56].copy_from_slice(&self.layout.data_start.to_le_bytes());
        block[56..60].copy_from_slice(&(self.volumes.len() as u32).to_le_bytes());
        for (index, volume) in self.volumes.iter().enumerate() {
            let at = SUPER_HEADER + index * VOLUME_ENTRY;
            block[at] = volume.name_len;
            block[at + 1..at + 1 + MAX_NAME].copy_from_slice(&volume.name);
            block[at + 72..at + 80].copy_from_slice(&volume.size.to_le_bytes());
        }
        let crc = checksum(block, SUPER_CRC);
        block[SUPER_CRC..SUPER_CRC + 4].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decodes and validates one copy.
    ///
    /// # Errors
    /// [`Invalid::Blank`] for a never-written copy, else what is wrong.
    pub fn decode(block: &[u8]) -> Result<Self, Invalid> {
        check_block(block, SUPER_MAGIC, SUPER_CRC)?;
        if le32(block, 8) != VERSION {
            return Err(Invalid::Corrupt("unknown superblock version"));
        }
        if le32(block, 28) != BLOCK as u32 {
            return Err(Invalid::Corrupt("metadata block size is not 4096"));
        }
        let pool_size = le64(block, 32);
        let extent_size = le32(block, 24);
        let layout = Layout::for_pool(pool_size, extent_size)
            .ok_or(Invalid::Corrupt("layout does not fit the pool size"))?;
        let stored = Layout {
            extent_size,
            extent_count: le32(block, 40),
            map_blocks: le32(block, 44),
            data_start: le64(block, 48),
        };
        if stored != layout {
            return Err(Invalid::Corrupt(
                "layout fields disagree with the pool size",
            ));
        }
        let count = le32(block, 56) as usize;
        if count > MAX_VOLUMES {
            return Err(Invalid::Corrupt("volume count over the table size"));
        }
        let mut volumes = heapless::Vec::new();
        for index in 0..count {
            let at = SUPER_HEADER + index * VOLUME_ENTRY;
            let name_len = block[at];
            if name_len == 0 || usize::from(name_len) > MAX_NAME {
                return Err(Invalid::Corrupt("volume name length"));
            }
            let mut name = [0; MAX_NAME];
            name.copy_from_slice(&block[at + 1..at + 1 + MAX_NAME]);
            let entry = VolumeEntry {
                name,
                name_len,
                size: le64(block, at + 72),
            };
            // Cannot fail: count <= MAX_VOLUMES.
            let _ = volumes.push(entry);
        }
        Ok(Self {
            seq: le64(block, 16),
            pool_size,
            layout,
            volumes,
        })
    }
}

/// One map entry: who owns a physical extent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// Owning volume's table index + 1; 0: the extent is free.
    pub volume: u16,
    /// The virtual extent of that volume it holds.
    pub virtual_extent: u32,
    /// Pool-wide allocation counter when it was mapped (the newer of two
    /// entries claiming one virtual extent wins at open).
    pub generation: u64,
}

impl Entry {
    /// The free entry.
    pub const FREE: Self = Self {
        volume: 0,
        virtual_extent: 0,
        generation: 0,
    };
}

/// Encodes map block `index` version `seq` with `entries` (at most
/// [`ENTRIES_PER_BLOCK`]; the rest free) into `block`.
pub fn encode_map(block: &mut [u8], index: u32, seq: u64, entries: &[Entry]) {
    let block = &mut block[..BLOCK];
    block.fill(0);
    block[..4].copy_from_slice(MAP_MAGIC);
    block[8..16].copy_from_slice(&seq.to_le_bytes());
    block[16..20].copy_from_slice(&index.to_le_bytes());
    block[20..24].copy_from_slice(&VERSION.to_le_bytes());
    for (slot, entry) in entries.iter().take(ENTRIES_PER_BLOCK as usize).enumerate() {
        let at = MAP_HEADER + slot * ENTRY;
        block[at..at + 2].copy_from_slice(&entry.volume.to_le_bytes());
        block[at + 4..at + 8].copy_from_slice(&entry.virtual_extent.to_le_bytes());
        block[at + 8..at + 16].copy_from_slice(&entry.generation.to_le_bytes());
    }
    let crc = checksum(block, MAP_CRC);
    block[MAP_CRC..MAP_CRC + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Validates map block copy `block` for index `index` and returns its
/// sequence number; [`map_entry`] then reads its entries.
///
/// # Errors
/// [`Invalid::Blank`] for a never-written copy, else what is wrong.
pub fn decode_map(block: &[u8], index: u32) -> Result<u64, Invalid> {
    check_block(block, MAP_MAGIC, MAP_CRC)?;
    if le32(block, 20) != VERSION {
        return Err(Invalid::Corrupt("unknown map block version"));
    }
    if le32(block, 16) != index {
        return Err(Invalid::Corrupt("map block written at the wrong place"));
    }
    Ok(le64(block, 8))
}

/// Entry `slot` of a validated map block.
pub fn map_entry(block: &[u8], slot: usize) -> Entry {
    let at = MAP_HEADER + slot * ENTRY;
    Entry {
        volume: u16::from_le_bytes([block[at], block[at + 1]]),
        virtual_extent: le32(block, at + 4),
        generation: le64(block, at + 8),
    }
}

/// Of two decoded copies, the one to use: the valid copy with the higher
/// sequence number, with its copy index. `Ok(None)`: nothing was ever
/// written — both blank, or (with `torn_first`) one blank and one corrupt,
/// which is a first write torn before it completed (never acknowledged).
///
/// # Errors
/// Both copies invalid, at least one not blank (the corruption of the
/// newer).
pub fn newer<T>(
    a: Result<T, Invalid>,
    b: Result<T, Invalid>,
    seq: impl Fn(&T) -> u64,
    torn_first: bool,
) -> Result<Option<(T, u64)>, &'static str> {
    match (a, b) {
        (Ok(a), Ok(b)) => Ok(Some(if seq(&b) > seq(&a) { (b, 1) } else { (a, 0) })),
        (Ok(a), Err(_)) => Ok(Some((a, 0))),
        (Err(_), Ok(b)) => Ok(Some((b, 1))),
        (Err(Invalid::Blank), Err(Invalid::Blank)) => Ok(None),
        (Err(Invalid::Blank), Err(Invalid::Corrupt(_)))
        | (Err(Invalid::Corrupt(_)), Err(Invalid::Blank))
            if torn_first =>
        {
            Ok(None)
        }
        (Err(Invalid::Corrupt(why)), _) | (_, Err(Invalid::Corrupt(why))) => Err(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_fits_and_aligns() {
        let layout = Layout::for_pool(64 << 20, DEFAULT_EXTENT).unwrap();
        assert_eq!(layout.data_start, 2 << 20);
        assert_eq!(layout.extent_count, 31);
        assert_eq!(layout.map_blocks, 1);
        assert!(Layout::for_pool(2 << 20, DEFAULT_EXTENT).is_none());
        let big = Layout::for_pool(1 << 40, DEFAULT_EXTENT).unwrap();
        // The numbers docs/THIN.md gives.
        assert_eq!((big.extent_count, big.map_blocks), (524_279, 2_065));
        assert_eq!(big.data_start, 18 << 20);
        let meta_end = big.map_offset(big.map_blocks - 1, 1) + BLOCK as u64;
        assert!(meta_end <= big.data_start);
        assert!(
            u64::from(big.map_blocks) * u64::from(ENTRIES_PER_BLOCK) >= u64::from(big.extent_count)
        );
        assert!(big.extent_offset(big.extent_count) <= 1 << 40);
    }

    #[test]
    fn superblock_round_trip_and_corruption() {
        let mut volumes = heapless::Vec::new();
        volumes
            .push(VolumeEntry::new("thin0", 8 << 20).unwrap())
            .unwrap();
        let sb = Superblock {
            seq: 7,
            pool_size: 64 << 20,
            layout: Layout::for_pool(64 << 20, DEFAULT_EXTENT).unwrap(),
            volumes,
        };
        let mut block = [0u8; BLOCK];
        sb.encode(&mut block);
        assert_eq!(Superblock::decode(&block), Ok(sb));
        block[100] ^= 1;
        assert_eq!(
            Superblock::decode(&block),
            Err(Invalid::Corrupt("checksum mismatch"))
        );
        assert_eq!(Superblock::decode(&[0; BLOCK]), Err(Invalid::Blank));
    }

    #[test]
    fn map_round_trip_and_choice() {
        let entries = [
            Entry::FREE,
            Entry {
                volume: 2,
                virtual_extent: 9,
                generation: 44,
            },
        ];
        let mut a = [0u8; BLOCK];
        let mut b = [0u8; BLOCK];
        encode_map(&mut a, 3, 5, &entries);
        encode_map(&mut b, 3, 6, &entries[..1]);
        assert_eq!(decode_map(&a, 3), Ok(5));
        assert_eq!(map_entry(&a, 1), entries[1]);
        assert_eq!(
            decode_map(&a, 4),
            Err(Invalid::Corrupt("map block written at the wrong place"))
        );
        let pick = newer(decode_map(&a, 3), decode_map(&b, 3), |s| *s, true).unwrap();
        assert_eq!(pick, Some((6, 1)));
        b[2000] ^= 0x10; // torn: the older copy is used
        let pick = newer(decode_map(&a, 3), decode_map(&b, 3), |s| *s, true).unwrap();
        assert_eq!(pick, Some((5, 0)));
        assert_eq!(
            newer(Err(Invalid::Blank), decode_map(&b, 3), |s| *s, true),
            Ok(None)
        );
        assert!(newer(Err(Invalid::Blank), decode_map(&b, 3), |s| *s, false).is_err());
        a[9] ^= 1;
        assert!(newer(decode_map(&a, 3), decode_map(&b, 3), |s| *s, true).is_err());
    }
}
