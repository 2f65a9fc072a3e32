# The Docker-in-Docker engine for the runtime (Compose's dind mode, the Helm chart's sidecar): Debian's dockerd
# on the service base (deploy/build-base-image.sh service), so no registry is needed. It needs what a privileged
# container gets (it creates namespaces, cgroups, bridges and iptables rules of its own: deploy/compose.yaml spells
# it out); its sandboxes are its own containers, apart from the host's. Built by deploy/build-service-images.sh.
ARG BASE_IMAGE=mentis/service-base:bookworm
FROM ${BASE_IMAGE}

COPY dind-entrypoint.sh /usr/local/bin/mentis-dind-entrypoint
VOLUME /var/lib/docker
LABEL io.mentis.managed=true \
      io.mentis.component=dind
HEALTHCHECK --interval=5s --timeout=5s --start-period=30s --retries=6 CMD ["docker", "version"]
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/mentis-dind-entrypoint"]
