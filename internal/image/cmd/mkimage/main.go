// Command mkimage builds the otelcol-profiling container images without a
// container engine: one image per binary given, and an OCI image index of
// them all, so that a mixed fleet pulls the image of each node's
// architecture:
//
//	make dist dist-arm64                           # _build/otelcol-profiling, _build/linux-arm64/otelcol-profiling
//	go run ./internal/image/cmd/mkimage -binary _build/otelcol-profiling -binary _build/linux-arm64/otelcol-profiling
//
// writes into -out (default _build/image):
//
//	otelcol-profiling_<version>_linux_<arch>.image.tar   each image alone: docker load -i, podman load -i
//	otelcol-profiling_<version>.oci.tar                  the index as an OCI layout in a tar:
//	                                                     skopeo copy --all oci-archive:...:<version> docker://...
//
// Each binary's architecture is its ELF machine (amd64 or arm64).
// SOURCE_DATE_EPOCH, when set, stamps the files and the images instead of
// the Unix epoch.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sonde-dev/sonde/internal/image"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

// binaries is a flag given once per binary.
type binaries []string

func (b *binaries) String() string     { return strings.Join(*b, ",") }
func (b *binaries) Set(s string) error { *b = append(*b, s); return nil }

func run(args []string) error {
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	var o image.Options
	var bins binaries
	fs.Var(&bins, "binary", "otelcol-profiling executable, once per architecture (default _build/otelcol-profiling)")
	fs.StringVar(&o.CACerts, "ca-certs", "/etc/ssl/certs/ca-certificates.crt", "PEM bundle of CA certificates (empty: none)")
	fs.StringVar(&o.Config, "config", "config/agent.yaml", "default Collector configuration (empty: none)")
	fs.StringVar(&o.Version, "version", "0.1.0", "image version (label and tag)")
	fs.StringVar(&o.Source, "source", "https://github.com/sonde-dev/sonde", "source repository (label)")
	repo := fs.String("repository", "ghcr.io/sonde-dev/otelcol-profiling", "image repository; the tag is -version")
	out := fs.String("out", "_build/image", "output directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if len(bins) == 0 {
		bins = binaries{"_build/otelcol-profiling"}
	}
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
		}
		o.Created = time.Unix(sec, 0)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	ref := *repo + ":" + o.Version
	base := "otelcol-profiling_" + o.Version
	var imgs []v1.Image
	for _, b := range bins {
		o.Binary = b
		img, err := image.Build(o)
		if err != nil {
			return err
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return fmt.Errorf("image config: %w", err)
		}
		path := filepath.Join(*out, fmt.Sprintf("%s_%s_%s.image.tar", base, cf.OS, cf.Architecture))
		if err := image.WriteTarball(path, ref, img); err != nil {
			return err
		}
		digest, err := img.Digest()
		if err != nil {
			return fmt.Errorf("image digest: %w", err)
		}
		fmt.Printf("%s %s@%s (%s/%s)\n", path, ref, digest, cf.OS, cf.Architecture)
		imgs = append(imgs, img)
	}
	idx, err := image.Index(imgs)
	if err != nil {
		return err
	}
	path := filepath.Join(*out, base+".oci.tar")
	if err := image.WriteOCIArchive(path, ref, o.Version, idx, o.Created); err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return fmt.Errorf("image index digest: %w", err)
	}
	fmt.Printf("%s %s@%s (index of %d)\n", path, ref, digest, len(imgs))
	return nil
}
