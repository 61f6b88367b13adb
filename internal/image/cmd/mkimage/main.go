// Command mkimage builds the otelcol-profiling container image as a tarball,
// without a container engine:
//
//	make dist                                      # OCB writes _build/otelcol-profiling
//	go run ./internal/image/cmd/mkimage            # writes _build/otelcol-profiling-image.tar
//	docker load -i _build/otelcol-profiling-image.tar   # or: crane push _build/... ghcr.io/...
//
// SOURCE_DATE_EPOCH, when set, stamps the files and the image instead of the
// Unix epoch.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/sonde-dev/sonde/internal/image"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	var o image.Options
	fs.StringVar(&o.Binary, "binary", "_build/otelcol-profiling", "otelcol-profiling executable")
	fs.StringVar(&o.CACerts, "ca-certs", "/etc/ssl/certs/ca-certificates.crt", "PEM bundle of CA certificates (empty: none)")
	fs.StringVar(&o.Config, "config", "config/agent.yaml", "default Collector configuration (empty: none)")
	fs.StringVar(&o.Version, "version", "0.1.0", "image version (label and tag)")
	fs.StringVar(&o.Source, "source", "https://github.com/sonde-dev/sonde", "source repository (label)")
	fs.StringVar(&o.Arch, "arch", "", "GOARCH of the binary (default: this machine's)")
	repo := fs.String("repository", "ghcr.io/sonde-dev/otelcol-profiling", "image repository; the tag is -version")
	out := fs.String("out", "_build/otelcol-profiling-image.tar", "output tarball")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
		}
		o.Created = time.Unix(sec, 0)
	}
	img, err := image.Build(o)
	if err != nil {
		return err
	}
	ref := *repo + ":" + o.Version
	if err := image.WriteTarball(*out, ref, img); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("image digest: %w", err)
	}
	fmt.Printf("%s %s@%s\n", *out, ref, digest)
	return nil
}
