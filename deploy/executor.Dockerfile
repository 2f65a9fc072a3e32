# The sandbox image: the base image (deploy/build-base-image.sh) plus our mentis-executor gRPC server.
# Built by deploy/build-executor-image.sh from a build context that holds only the binary.
# BASE_IMAGE is the hash-tagged base image (mentis/base:bookworm-<hash>), so a new base means a new executor image.
ARG BASE_IMAGE=mentis/base:bookworm
FROM ${BASE_IMAGE}

# /.mentis/bin holds what a sandbox of any image needs of ours: the executor, linked statically, and tini's
# static build. The runtime copies this folder into a volume (`mentis-executor install`) and mounts it
# read-only at /.mentis of every sandbox, whatever its image (docs/ARCHITECTURE.md, "Any image"); this image
# is also the default sandbox image, and runs by hand as it is.
# The script puts the binary in the context with mode 0755; COPY keeps the mode and makes root the owner.
# (No --chmod: the legacy builder, used here because no buildx plugin is installed, does not know it.)
COPY mentis-executor /.mentis/bin/mentis-executor
RUN cp /usr/bin/tini-static /.mentis/bin/tini && ln -s /.mentis/bin/mentis-executor /usr/local/bin/mentis-executor

# User code runs as the unprivileged user `sandbox` (1000), in the workspace volume. The runtime starts the
# container as root with only CAP_SETUID, CAP_SETGID and CAP_CHOWN and MENTIS_SANDBOX_USER=1000:1000: the
# executor's launcher gives a root-owned workspace to the sandbox user and drops CAP_CHOWN; the executor keeps
# root as its real uid (so user code cannot signal or trace it) and runs user code as 1000 with no capability
# (docs/ARCHITECTURE.md, Security model). Run by hand without those, everything runs as 1000.
USER 1000:1000
WORKDIR /workspace
EXPOSE 50052
LABEL io.mentis.managed=true \
      io.mentis.component=executor
# tini is PID 1: it reaps the zombies left by user processes and forwards SIGTERM to the executor. `launch`
# checks the image and execs it with the token moved from its environment (readable in /proc/1/environ) into
# a pipe. The runtime sets this same entrypoint on every sandbox, from the mounted /.mentis.
ENTRYPOINT ["/.mentis/bin/mentis-executor", "launch", "--", "/.mentis/bin/tini", "--", "/.mentis/bin/mentis-executor"]
