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
// given kernel image instead.
package kernelcheck
