// Package kernelcheck holds only a test: it boots an older Linux kernel (a
// Debian kernel image) under QEMU with this package's own test binary as
// init, which loads and verifies every eBPF program of package support one
// by one, starts a Tracer with off-CPU profiling on, and reports the results
// on the serial console. A program that an older verifier rejects fails the
// test, so a verifier regression is caught before users see it.
//
// The kernel comes from the Debian archive (`apt-get download`, then
// `dpkg-deb`) and is cached under $SONDE_KERNEL_CACHE, else the user's cache
// directory (sonde-kernels/). SONDE_KERNELCHECK_PACKAGES names the kernel
// packages to boot (space-separated; default: the one linux-image-amd64
// depends on, Linux 6.1 on Debian 12); SONDE_KERNELCHECK_VMLINUZ boots a
// given kernel image instead. The guest also loads an unwind table.
//
// TestARM64UnderQEMU (under CI=true) boots Debian's arm64 kernel the same
// way under emulated qemu-system-aarch64, with the test binary built for
// arm64 and cross-built workloads in the initramfs, and also runs the
// profiler over them there. Its kernel comes from the archive through an
// apt state of its own ($SONDE_KERNEL_CACHE/apt-arm64);
// SONDE_KERNELCHECK_ARM64_VMLINUZ boots a given image instead.
package kernelcheck
