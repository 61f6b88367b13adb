# otelcol-profiling image for those with a container engine. Without one,
# `make image` builds the same image as a tarball, for linux/amd64 and
# linux/arm64, and their OCI image index.
#
#   docker build -t ghcr.io/sonde-dev/otelcol-profiling:0.1.0 .
#
# The eBPF objects are committed (support/), so no clang is needed here.

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# A static binary: the final image has no libc.
ENV CGO_ENABLED=0
# The Collector Builder of the release builder-config.yaml names.
RUN go run go.opentelemetry.io/collector/cmd/builder@$(sed -n 's|.*collector/receiver/otlpreceiver \(v[0-9.]*\).*|\1|p' builder-config.yaml) \
      --config builder-config.yaml

FROM scratch
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="otelcol-profiling" \
      org.opencontainers.image.description="OpenTelemetry Collector with the Sonde eBPF profiler" \
      org.opencontainers.image.source="https://github.com/sonde-dev/sonde" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build --chmod=0755 /src/_build/otelcol-profiling /otelcol-profiling
COPY config/agent.yaml /etc/otelcol/config.yaml
# Root: loading eBPF and reading every process needs capabilities that a
# non-root user would lose at exec. Grant them with --cap-add (see README).
USER 0
ENTRYPOINT ["/otelcol-profiling"]
CMD ["--config=/etc/otelcol/config.yaml", "--feature-gates=service.profilesSupport"]
