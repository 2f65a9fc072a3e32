# The runtime image: the service base (deploy/build-base-image.sh service: Debian's Docker CLI, iptables,
# e2fsprogs, tini) plus mentis-runtime and the executor image it starts sandboxes from, as a tarball loaded into
# whatever engine the runtime is given when that engine lacks it (Docker-in-Docker starts empty, and there is no
# registry to pull from). Built by deploy/build-service-images.sh; docs/DEPLOY.md says what it needs and why.
ARG BASE_IMAGE=mentis/service-base:bookworm
FROM ${BASE_IMAGE}

COPY mentis-runtime /usr/local/bin/mentis-runtime
COPY runtime-entrypoint.sh /usr/local/bin/mentis-runtime-entrypoint
COPY executor-image.tar.gz executor-image.hash /usr/share/mentis/

# In a container the API must be reachable from outside it; health alone is also served in plaintext on
# loopback, for the HEALTHCHECK below whatever the API's transport (TLS, mutual TLS).
ENV MENTIS_LISTEN=0.0.0.0:50051 \
    MENTIS_HEALTH_LISTEN=127.0.0.1:50060 \
    MENTIS_DATA_DIR=/var/lib/mentis \
    MENTIS_EXECUTOR_IMAGE=mentis/executor:latest
EXPOSE 50051
LABEL io.mentis.managed=true \
      io.mentis.component=runtime
HEALTHCHECK --interval=10s --timeout=6s --start-period=60s --retries=3 \
  CMD ["/usr/local/bin/mentis-runtime", "healthcheck"]
# tini reaps what the runtime starts (mkfs, losetup, iptables) and forwards SIGTERM, which drains the runtime.
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/mentis-runtime-entrypoint"]
