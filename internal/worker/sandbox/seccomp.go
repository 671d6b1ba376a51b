package sandbox

import (
	"encoding/binary"
	"fmt"
	"runtime"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The agent's seccomp filter (given to bwrap with --seccomp, loaded just
// before the program runs, inherited by everything it starts) refuses:
//
//   - fallocate, and the ioctls that do the same (FS_IOC_RESVSP and
//     kin), with EOPNOTSUPP, as filesystems without it answer: it reserves
//     any amount of disk at once (and with FALLOC_FL_KEEP_SIZE past
//     RLIMIT_FSIZE), faster than any measuring can see. Programs fall back
//     to writing (glibc's posix_fallocate does), which the disk's speed
//     bounds;
//   - user namespaces (clone and unshare with CLONE_NEWUSER), with EPERM,
//     and clone3 (whose flags a filter cannot read), with ENOSYS, which
//     makes glibc fall back to clone: inside a namespace of its own the
//     agent would mount memory filesystems nothing counts and reach kernel
//     code no agent needs (bwrap's --disable-userns does the same where
//     the jail has a /proc of its own; in a pod it cannot);
//   - io_uring (io_uring_setup, with ENOSYS, as kernels without it answer):
//     its operations (a fallocate among them) are no system calls a filter
//     sees;
//   - the other ABIs of the machine (x32) it does not describe, with
//     ENOSYS.
//
// Everything else is allowed: the jail's namespaces, dropped capabilities
// and limits are the rest of the containment.

// seccompArch is one ABI's audit architecture and syscall numbers.
type seccompArch struct {
	audit                                                       uint32
	fallocate, clone, clone3, unshare, ioUringSetup, ioctl, x32 uint32
	// prealloc are the ioctl requests that reserve space as fallocate
	// does (FS_IOC_RESVSP, FS_IOC_RESVSP64, FS_IOC_ZERO_RANGE, and XFS's
	// ALLOCSP of older kernels) in this ABI's encoding.
	prealloc []uint32
}

// seccompArches are the ABIs a process of GOARCH's kernel can call in:
// the native one first.
var seccompArches = map[string][]seccompArch{
	"amd64": {
		{audit: unix.AUDIT_ARCH_X86_64, fallocate: 285, clone: 56, clone3: 435, unshare: 272, ioUringSetup: 425, ioctl: 16, prealloc: prealloc64, x32: 0x40000000},
		{audit: unix.AUDIT_ARCH_I386, fallocate: 324, clone: 120, clone3: 435, unshare: 310, ioUringSetup: 425, ioctl: 54, prealloc: prealloc32},
	},
	"arm64": {
		{audit: unix.AUDIT_ARCH_AARCH64, fallocate: 47, clone: 220, clone3: 435, unshare: 97, ioUringSetup: 425, ioctl: 29, prealloc: prealloc64},
		{audit: unix.AUDIT_ARCH_ARM, fallocate: 352, clone: 120, clone3: 435, unshare: 337, ioUringSetup: 425, ioctl: 54, prealloc: prealloc32},
	},
}

// The preallocating ioctl requests: _IOW('X', 40|41|42|57, struct
// space_resv) for FS_IOC_ALLOCSP, FS_IOC_RESVSP, FS_IOC_ALLOCSP64... (the
// numbers of include/uapi/linux/falloc.h and XFS), whose struct is 48 bytes
// where 64-bit alignment holds and 44 on i386 and arm's compat ABI.
var (
	prealloc64 = []uint32{0x4030580a, 0x4030580b, 0x40305824, 0x40305825, 0x40305828, 0x4030582a, 0x40305839}
	prealloc32 = []uint32{0x402c580a, 0x402c580b, 0x402c5824, 0x402c5825, 0x402c5828, 0x402c582a, 0x402c5839}
)

const (
	seccompRetAllow = 0x7fff0000
	seccompRetErrno = 0x00050000
	cloneNewUser    = 0x10000000
)

// seccompFilter returns the agent's filter as the bytes of a compiled
// classic BPF program (struct sock_filter, native byte order), or nil when
// the filter does not know this GOARCH.
func seccompFilter() ([]byte, error) {
	arches, ok := seccompArches[runtime.GOARCH]
	if !ok {
		return nil, nil
	}
	errno := func(e unix.Errno) bpf.Instruction { return bpf.RetConstant{Val: seccompRetErrno | uint32(e)} }
	allow := bpf.RetConstant{Val: seccompRetAllow}
	// Blocks are built back to front so that each jump knows its distance.
	var prog []bpf.Instruction
	prog = append(prog, allow) // an ABI the filter does not know (none on these kernels)
	for i := len(arches) - 1; i >= 0; i-- {
		a := arches[i]
		// The flags check: arg 0 of clone and unshare (the low 32 bits,
		// offset 16 of struct seccomp_data, little-endian on both).
		flags := []bpf.Instruction{
			bpf.LoadAbsolute{Off: 16, Size: 4},
			bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: cloneNewUser, SkipTrue: 1},
			allow,
			errno(unix.EPERM),
		}
		var body []bpf.Instruction
		body = append(body, bpf.LoadAbsolute{Off: 0, Size: 4})
		if a.x32 != 0 {
			body = append(body, bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: a.x32, SkipFalse: 1}, errno(unix.ENOSYS))
		}
		// Then: fallocate, clone3, io_uring_setup, ioctl, clone, unshare,
		// allow, flags, the ioctl request check.
		tail := []bpf.Instruction{
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: a.fallocate, SkipFalse: 1}, errno(unix.EOPNOTSUPP),
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: a.clone3, SkipFalse: 1}, errno(unix.ENOSYS),
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: a.ioUringSetup, SkipFalse: 1}, errno(unix.ENOSYS),
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: a.ioctl, SkipTrue: uint8(3 + len(flags))},
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: a.clone, SkipTrue: 2},
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: a.unshare, SkipTrue: 1},
			allow,
		}
		// The ioctl's request: arg 1 (offset 24), its low 32 bits.
		req := []bpf.Instruction{bpf.LoadAbsolute{Off: 24, Size: 4}}
		for i, r := range a.prealloc {
			// Equal: to the errno after the remaining checks and the allow.
			req = append(req, bpf.JumpIf{Cond: bpf.JumpEqual, Val: r, SkipTrue: uint8(len(a.prealloc) - i)})
		}
		req = append(req, allow, errno(unix.EOPNOTSUPP))
		body = append(body, tail...)
		body = append(body, flags...)
		body = append(body, req...)
		// The arch check skips this block when it is another ABI's.
		block := append([]bpf.Instruction{bpf.LoadAbsolute{Off: 4, Size: 4},
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: a.audit, SkipFalse: uint8(len(body))}}, body...)
		prog = append(block, prog...)
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, fmt.Errorf("seccomp filter: %w", err)
	}
	out := make([]byte, 0, 8*len(raw))
	for _, r := range raw {
		out = binary.NativeEndian.AppendUint16(out, r.Op)
		out = append(out, r.Jt, r.Jf)
		out = binary.NativeEndian.AppendUint32(out, r.K)
	}
	return out, nil
}
