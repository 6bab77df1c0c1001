//! skiff's kernel programs. Socket level (`sock`): cgroup v2 sock_addr hooks translate a
//! service address at connect()/sendmsg() and back at recvmsg()/getpeername(). Packet level
//! (`nodeport`): tc (TCX) programs on the node's interfaces, and optionally XDP in front of
//! them, translate north-south traffic (NodePort, external IPs, LoadBalancer addresses) with
//! connection tracking for the reverse path. Both choose backends the same way (`select`)
//! from the same maps (`maps`, layouts in proxy-common).
#![no_std]
#![no_main]

mod csum;
mod maps;
mod nodeport;
mod select;
mod sock;

use aya_ebpf::{
    bindings::{bpf_fib_lookup as FibParams, xdp_action, BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS, TC_ACT_OK, TC_ACT_SHOT},
    helpers::{bpf_fib_lookup, bpf_redirect_neigh},
    macros::{cgroup_sock_addr, classifier, xdp},
    programs::{SockAddrContext, TcContext, XdpContext},
    EbpfContext,
};
use aya_log_ebpf::debug;
use nodeport::{Act, Flow, Kind};
use sock::Hook;

#[cgroup_sock_addr(connect4)]
pub fn skiff_connect4(ctx: SockAddrContext) -> i32 {
    sock::forward4(&ctx, Hook::Connect)
}

#[cgroup_sock_addr(connect6)]
pub fn skiff_connect6(ctx: SockAddrContext) -> i32 {
    sock::forward6(&ctx, Hook::Connect)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn skiff_sendmsg4(ctx: SockAddrContext) -> i32 {
    sock::forward4(&ctx, Hook::Send)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn skiff_sendmsg6(ctx: SockAddrContext) -> i32 {
    sock::forward6(&ctx, Hook::Send)
}

#[cgroup_sock_addr(recvmsg4)]
pub fn skiff_recvmsg4(ctx: SockAddrContext) -> i32 {
    sock::reverse4(&ctx)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn skiff_recvmsg6(ctx: SockAddrContext) -> i32 {
    sock::reverse6(&ctx)
}

#[cgroup_sock_addr(getpeername4)]
pub fn skiff_getpeername4(ctx: SockAddrContext) -> i32 {
    sock::reverse4(&ctx)
}

#[cgroup_sock_addr(getpeername6)]
pub fn skiff_getpeername6(ctx: SockAddrContext) -> i32 {
    sock::reverse6(&ctx)
}

const AF_INET: u8 = 2;

/// The route to the packet's (rewritten) destination: the outgoing interface and, when the
/// neighbour is known, the MAC addresses.
#[inline(always)]
fn fib<C: EbpfContext>(ctx: &C, f: &Flow, rw: &nodeport::Rewrite, ifindex: u32) -> (i64, FibParams) {
    let (addrs, ports) = nodeport::changes(f, rw);
    // SAFETY: an all-zero fib lookup struct is a valid input.
    let mut p: FibParams = unsafe { core::mem::zeroed() };
    p.family = AF_INET;
    p.l4_protocol = f.proto;
    p.sport = ports[0].2;
    p.dport = ports[1].2;
    p.__bindgen_anon_1.tot_len = f.tot_len;
    p.ifindex = ifindex;
    p.__bindgen_anon_3.ipv4_src = addrs[0].2;
    p.__bindgen_anon_4.ipv4_dst = addrs[1].2;
    // SAFETY: the context is the kernel's; p is a live, correctly sized struct.
    let r = unsafe {
        bpf_fib_lookup(
            ctx.as_ptr(),
            &mut p,
            core::mem::size_of::<FibParams>() as i32,
            0,
        )
    };
    (r, p)
}

/// Rewrites with the checksum helpers (they handle partial checksums of locally sent
/// packets correctly).
#[inline(always)]
fn rewrite_tc(ctx: &mut TcContext, f: &Flow, rw: &nodeport::Rewrite) -> bool {
    const BPF_F_PSEUDO_HDR: u64 = 1 << 4;
    const BPF_F_MARK_MANGLED_0: u64 = 1 << 5;
    let l4 = nodeport::l4_csum_off(f.proto);
    let udp0 = if f.proto == proxy_common::PROTO_UDP {
        BPF_F_MARK_MANGLED_0
    } else {
        0
    };
    let (addrs, ports) = nodeport::changes(f, rw);
    for (off, old, new) in addrs {
        if old == new {
            continue;
        }
        if ctx
            .l4_csum_replace(l4, old as u64, new as u64, BPF_F_PSEUDO_HDR | udp0 | 4)
            .is_err()
            || ctx
                .l3_csum_replace(nodeport::IP_CSUM_OFF, old as u64, new as u64, 4)
                .is_err()
            || ctx.store(off, &new, 0).is_err()
        {
            return false;
        }
    }
    for (off, old, new) in ports {
        if old == new {
            continue;
        }
        if ctx
            .l4_csum_replace(l4, old as u64, new as u64, udp0 | 2)
            .is_err()
            || ctx.store(off, &new, 0).is_err()
        {
            return false;
        }
    }
    true
}

#[inline(always)]
fn tc_flow(ctx: &mut TcContext) -> Option<Flow> {
    if let Some(f) = nodeport::parse(ctx.data(), ctx.data_end()) {
        return Some(f);
    }
    // Headers not in the linear part: pull them in once and try again.
    ctx.pull_data((nodeport::L4_OFF + 20) as u32).ok()?;
    nodeport::parse(ctx.data(), ctx.data_end())
}

#[inline(always)]
fn tc_finish(ctx: &mut TcContext, f: &Flow, act: Act, ifindex: u32) -> i32 {
    log_decision(ctx, f, &act);
    match act.kind {
        Kind::Pass => TC_ACT_OK,
        Kind::Drop => TC_ACT_SHOT,
        Kind::Local => {
            if rewrite_tc(ctx, f, &act.rw) {
                act.commit();
                TC_ACT_OK
            } else {
                TC_ACT_SHOT
            }
        }
        Kind::Forward => {
            let (r, p) = fib(ctx, f, &act.rw, ifindex);
            if r != BPF_FIB_LKUP_RET_SUCCESS as i64 && r != BPF_FIB_LKUP_RET_NO_NEIGH as i64 {
                select::drop_reason(select::Drop::NoRoute);
                return TC_ACT_SHOT;
            }
            if !rewrite_tc(ctx, f, &act.rw) {
                return TC_ACT_SHOT;
            }
            act.commit();
            // The kernel resolves the neighbour and fills in the MAC addresses.
            // SAFETY: helper valid for tc programs; no neighbour hint.
            unsafe { bpf_redirect_neigh(p.ifindex, core::ptr::null_mut(), 0, 0) as i32 }
        }
    }
}

/// A packet-level decision at debug level (`proxy run --bpf-log`; removed at load
/// without it). Flows that are no service's are not logged.
#[inline(always)]
fn log_decision<C: EbpfContext>(ctx: &C, f: &Flow, act: &Act) {
    let (s, d) = (u32::from_be(f.saddr), u32::from_be(f.daddr));
    let (sp, dp) = (u16::from_be(f.sport), u16::from_be(f.dport));
    match act.kind {
        Kind::Pass => {}
        Kind::Drop => debug!(ctx, "drop {:i}:{} -> {:i}:{} proto {}", s, sp, d, dp, f.proto),
        Kind::Local | Kind::Forward => {
            let rw = &act.rw;
            let pick32 = |bit: u8, new: u32, old: u32| if rw.mask & bit != 0 { u32::from_be(new) } else { old };
            let pick16 = |bit: u8, new: u16, old: u16| if rw.mask & bit != 0 { u16::from_be(new) } else { old };
            debug!(
                ctx,
                "{:i}:{} -> {:i}:{} becomes {:i}:{} -> {:i}:{}",
                s,
                sp,
                d,
                dp,
                pick32(nodeport::RW_SADDR, rw.saddr, s),
                pick16(nodeport::RW_SPORT, rw.sport, sp),
                pick32(nodeport::RW_DADDR, rw.daddr, d),
                pick16(nodeport::RW_DPORT, rw.dport, dp)
            )
        }
    }
}

#[inline(always)]
fn ingress_ifindex(ctx: &TcContext) -> u32 {
    // SAFETY: the kernel hands every tc program a valid skb.
    unsafe { (*ctx.skb.skb).ifindex }
}

/// North-south, arriving at a node interface.
#[classifier]
pub fn skiff_tc_ingress(mut ctx: TcContext) -> i32 {
    let Some(f) = tc_flow(&mut ctx) else {
        return TC_ACT_OK;
    };
    let ifindex = ingress_ifindex(&ctx);
    let act = nodeport::ingress(&f, ifindex);
    tc_finish(&mut ctx, &f, act, ifindex)
}

/// North-south, leaving a node interface: replies of flows served on this node.
#[classifier]
pub fn skiff_tc_egress(mut ctx: TcContext) -> i32 {
    let Some(f) = tc_flow(&mut ctx) else {
        return TC_ACT_OK;
    };
    let act = nodeport::egress(&f);
    let ifindex = ingress_ifindex(&ctx);
    tc_finish(&mut ctx, &f, act, ifindex)
}

/// The same translation as `skiff_tc_ingress`, before an skb exists. A flow to a backend
/// on this node is rewritten and passed up; one to another node goes straight back out
/// when the route leaves by the same interface (XDP_TX), else tc handles it; packets
/// carry complete checksums here (they arrived from a wire).
#[xdp]
pub fn skiff_xdp(ctx: XdpContext) -> u32 {
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let Some(f) = nodeport::parse(data, data_end) else {
        return xdp_action::XDP_PASS;
    };
    let ifindex = ctx.ingress_ifindex() as u32;
    let act = nodeport::ingress(&f, ifindex);
    log_decision(&ctx, &f, &act);
    match act.kind {
        Kind::Pass => xdp_action::XDP_PASS,
        Kind::Drop => xdp_action::XDP_DROP,
        Kind::Local => {
            if nodeport::rewrite_direct(data, data_end, &f, &act.rw) {
                // tc sees the rewritten packet, no longer the flow's: this is the last look.
                act.commit();
                xdp_action::XDP_PASS
            } else {
                xdp_action::XDP_DROP
            }
        }
        Kind::Forward => {
            let (r, p) = fib(&ctx, &f, &act.rw, ifindex);
            if r != BPF_FIB_LKUP_RET_SUCCESS as i64 || p.ifindex != ifindex {
                // tc finds the flow in the connection-tracking map and sends it (and
                // forgets a reset's flow then: `Act::ends`).
                return xdp_action::XDP_PASS;
            }
            if !nodeport::rewrite_direct(data, data_end, &f, &act.rw)
                || !nodeport::set_macs(data, data_end, &p.smac, &p.dmac)
            {
                return xdp_action::XDP_DROP;
            }
            act.commit();
            xdp_action::XDP_TX
        }
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[no_mangle]
#[link_section = "license"]
pub static LICENSE: [u8; 4] = *b"GPL\0";
