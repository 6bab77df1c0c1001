//! The UDP socket iterator that destroys connected UDP sockets whose backend left its
//! service. A connected UDP socket was translated once, at connect(), and would otherwise
//! send to a removed backend forever (the best-known pain of socket-level load balancing:
//! DNS and statsd clients). Kernel 6.5+ lets an `iter/udp` program call the kfunc
//! `bpf_sock_destroy`; the application then sees ECONNABORTED and reconnects, through the
//! service again.
//!
//! The program is assembled here rather than compiled in proxy-ebpf: aya 0.14 cannot
//! relocate kfunc calls, and the program is twenty-odd instructions. Per UDP socket of the
//! network namespace it runs in: an IPv4 socket connected to an address in the destroy set
//! (`SKIFF_UDP_DESTROY`, filled by the proxy) whose socket storage (`SKIFF_SOCK_REVNAT`)
//! shows the proxy translated it to that backend is destroyed. Sockets that connected to a
//! pod address themselves are left alone.

use super::sys::{self, MapSpec, ProgSpec};
use aya_obj::btf::{Btf, BtfKind};
use proxy_common::{
    UdpDestroyKey, REVNAT_BACKEND_PORT_OFFSET, REVNAT_BACKEND_V4_OFFSET, REVNAT_ENTRY_SIZE,
    REVNAT_PER_SOCKET,
};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

const BPF_PROG_TYPE_TRACING: u32 = 26;
const BPF_TRACE_ITER: u32 = 28;
const BPF_FUNC_MAP_LOOKUP_ELEM: i32 = 1;
const BPF_FUNC_SK_STORAGE_GET: i32 = 107;
const BPF_PSEUDO_MAP_FD: u8 = 1;
const BPF_PSEUDO_KFUNC_CALL: u8 = 2;
const AF_INET: i32 = 2;

/// Offsets in `struct bpf_iter__udp` (meta, udp_sk) and `struct sock_common`, whose layout
/// is kernel ABI for BPF: the verifier checks every access against the kernel's BTF.
const CTX_UDP_SK: i16 = 8;
const SKC_DADDR: i16 = 0;
const SKC_DPORT: i16 = 12;
const SKC_FAMILY: i16 = 16;

/// Registers.
const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2;
const R3: u8 = 3;
const R4: u8 = 4;
const R6: u8 = 6;
const R7: u8 = 7;
const R8: u8 = 8;
const R9: u8 = 9;
const FP: u8 = 10;

/// Load/store sizes.
const W: u8 = 0x00;
const H: u8 = 0x08;
const DW: u8 = 0x18;

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    (code as u64)
        | ((dst as u64 & 0xf) << 8)
        | ((src as u64 & 0xf) << 12)
        | ((off as u16 as u64) << 16)
        | ((imm as u32 as u64) << 32)
}

/// A tiny assembler: instructions plus forward jumps to labels, patched at the end.
#[derive(Default)]
struct Asm {
    code: Vec<u64>,
    /// (instruction index, label)
    fixups: Vec<(usize, Label)>,
    labels: Vec<Option<usize>>,
}

#[derive(Clone, Copy)]
struct Label(usize);

impl Asm {
    fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }
    fn bind(&mut self, l: Label) {
        self.labels[l.0] = Some(self.code.len());
    }
    fn ldx(&mut self, size: u8, dst: u8, src: u8, off: i16) {
        self.code.push(insn(0x61 | size, dst, src, off, 0));
    }
    fn stx(&mut self, size: u8, dst: u8, off: i16, src: u8) {
        self.code.push(insn(0x63 | size, dst, src, off, 0));
    }
    fn st_imm(&mut self, size: u8, dst: u8, off: i16, imm: i32) {
        self.code.push(insn(0x62 | size, dst, 0, off, imm));
    }
    fn mov_reg(&mut self, dst: u8, src: u8) {
        self.code.push(insn(0xbf, dst, src, 0, 0));
    }
    fn mov_imm(&mut self, dst: u8, imm: i32) {
        self.code.push(insn(0xb7, dst, 0, 0, imm));
    }
    fn add_imm(&mut self, dst: u8, imm: i32) {
        self.code.push(insn(0x07, dst, 0, 0, imm));
    }
    fn ld_map_fd(&mut self, dst: u8, map: &OwnedFd) {
        self.code
            .push(insn(0x18, dst, BPF_PSEUDO_MAP_FD, 0, map.as_raw_fd()));
        self.code.push(0);
    }
    fn jump(&mut self, code: u8, dst: u8, src: u8, imm: i32, to: Label) {
        self.fixups.push((self.code.len(), to));
        self.code.push(insn(code, dst, src, 0, imm));
    }
    /// if dst == imm goto
    fn jeq_imm(&mut self, dst: u8, imm: i32, to: Label) {
        self.jump(0x15, dst, 0, imm, to);
    }
    /// if dst != imm goto
    fn jne_imm(&mut self, dst: u8, imm: i32, to: Label) {
        self.jump(0x55, dst, 0, imm, to);
    }
    /// if dst != src goto
    fn jne_reg(&mut self, dst: u8, src: u8, to: Label) {
        self.jump(0x5d, dst, src, 0, to);
    }
    fn ja(&mut self, to: Label) {
        self.jump(0x05, 0, 0, 0, to);
    }
    fn call(&mut self, helper: i32) {
        self.code.push(insn(0x85, 0, 0, 0, helper));
    }
    fn call_kfunc(&mut self, btf_id: u32) {
        self.code
            .push(insn(0x85, 0, BPF_PSEUDO_KFUNC_CALL, 0, btf_id as i32));
    }
    fn exit(&mut self) {
        self.code.push(insn(0x95, 0, 0, 0, 0));
    }
    fn finish(mut self) -> Vec<u64> {
        for (at, l) in std::mem::take(&mut self.fixups) {
            let target = self.labels[l.0].expect("every label is bound");
            let off = target as i64 - at as i64 - 1;
            self.code[at] &= !(0xffff << 16);
            self.code[at] |= (off as i16 as u16 as u64) << 16;
        }
        self.code
    }
}

/// The program's instructions.
fn program(destroy: &OwnedFd, revnat: &OwnedFd, sock_destroy_btf_id: u32) -> Vec<u64> {
    let mut a = Asm::default();
    let out = a.label();
    let kill = a.label();
    a.ldx(DW, R6, R1, CTX_UDP_SK);
    a.jeq_imm(R6, 0, out);
    a.ldx(H, R2, R6, SKC_FAMILY);
    a.jne_imm(R2, AF_INET, out);
    a.ldx(W, R7, R6, SKC_DADDR);
    a.ldx(H, R8, R6, SKC_DPORT);
    // Not connected.
    a.jeq_imm(R8, 0, out);
    // Key (UdpDestroyKey) at fp-8: addr, port, padding.
    a.stx(W, FP, -8, R7);
    a.stx(H, FP, -4, R8);
    a.st_imm(H, FP, -2, 0);
    a.ld_map_fd(R1, destroy);
    a.mov_reg(R2, FP);
    a.add_imm(R2, -8);
    a.call(BPF_FUNC_MAP_LOOKUP_ELEM);
    a.jeq_imm(R0, 0, out);
    // Translated by the proxy to this very backend?
    a.ld_map_fd(R1, revnat);
    a.mov_reg(R2, R6);
    a.mov_imm(R3, 0);
    a.mov_imm(R4, 0);
    a.call(BPF_FUNC_SK_STORAGE_GET);
    a.jeq_imm(R0, 0, out);
    a.mov_reg(R9, R0);
    for i in 0..REVNAT_PER_SOCKET {
        let next = a.label();
        let base = (i * REVNAT_ENTRY_SIZE) as i16;
        a.ldx(W, R1, R9, base + REVNAT_BACKEND_V4_OFFSET as i16);
        a.jne_reg(R1, R7, next);
        a.ldx(H, R1, R9, base + REVNAT_BACKEND_PORT_OFFSET as i16);
        a.jne_reg(R1, R8, next);
        a.ja(kill);
        a.bind(next);
    }
    a.ja(out);
    a.bind(kill);
    a.mov_reg(R1, R6);
    a.call_kfunc(sock_destroy_btf_id);
    a.bind(out);
    a.mov_imm(R0, 0);
    a.exit();
    a.finish()
}

/// The loaded iterator and its destroy set.
pub struct UdpDestroyer {
    destroy: OwnedFd,
    link: OwnedFd,
}

#[derive(Debug, thiserror::Error)]
pub enum IterError {
    #[error("kernel BTF: {0}")]
    Btf(String),
    #[error("creating the UDP destroy set: {0}")]
    Map(io::Error),
    #[error("loading the UDP socket iterator: {0}")]
    Load(io::Error),
    #[error("linking the UDP socket iterator: {0}")]
    Link(io::Error),
}

/// Capacity of the destroy set: backends removed in one sweep.
const DESTROY_SET: u32 = 4096;

impl UdpDestroyer {
    /// Loads the iterator against the socket storage map `revnat`.
    pub fn load(btf: &Btf, revnat: &OwnedFd) -> Result<UdpDestroyer, IterError> {
        let id = |name: &str| {
            btf.id_by_type_name_kind(name, BtfKind::Func)
                .map_err(|e| IterError::Btf(format!("{name}: {e}")))
        };
        let attach = id("bpf_iter_udp")?;
        let kfunc = id("bpf_sock_destroy")?;
        let destroy = sys::map_create(MapSpec {
            map_type: sys::BPF_MAP_TYPE_HASH,
            key_size: std::mem::size_of::<UdpDestroyKey>() as u32,
            value_size: 1,
            max_entries: DESTROY_SET,
            ..Default::default()
        })
        .map_err(IterError::Map)?;
        let insns = program(&destroy, revnat, kfunc);
        let prog = sys::prog_load(&ProgSpec {
            prog_type: BPF_PROG_TYPE_TRACING,
            expected_attach_type: BPF_TRACE_ITER,
            attach_btf_id: attach,
            name: "skiff_udp_kill",
            insns: &insns,
        })
        .map_err(IterError::Load)?;
        let link = sys::iter_link_create(&prog, BPF_TRACE_ITER).map_err(IterError::Link)?;
        Ok(UdpDestroyer { destroy, link })
    }

    /// Destroys, in the calling thread's network namespace, the connected UDP sockets the
    /// proxy translated to one of `backends`. The set must be loaded with [`Self::arm`].
    pub fn sweep_here(&self) -> io::Result<()> {
        use std::io::Read as _;
        let iter = sys::iter_create(&self.link)?;
        let mut f = std::fs::File::from(iter);
        let mut buf = [0u8; 64];
        // The program prints nothing: reading to the end runs it over every socket.
        while f.read(&mut buf)? > 0 {}
        Ok(())
    }

    /// Puts `backends` (IPv4, user_ip4 layout; port in network byte order) in the set.
    pub fn arm(&self, backends: &[UdpDestroyKey]) -> io::Result<()> {
        for k in backends.iter().take(DESTROY_SET as usize) {
            sys::map_update(&self.destroy, k, &1u8)?;
        }
        Ok(())
    }

    /// Empties the set again.
    pub fn disarm(&self, backends: &[UdpDestroyKey]) -> io::Result<()> {
        for k in backends {
            sys::map_delete(&self.destroy, k)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumps_are_patched_relative_to_the_next_instruction() {
        let mut a = Asm::default();
        let end = a.label();
        a.jeq_imm(R1, 0, end);
        a.mov_imm(R0, 1);
        a.bind(end);
        a.exit();
        let code = a.finish();
        // Offset 1: skips the mov.
        assert_eq!((code[0] >> 16) & 0xffff, 1);
        assert_eq!(code[0] & 0xff, 0x15);
        assert_eq!(code[2] & 0xff, 0x95);
    }
}
