# Versions of the test cluster (sourced by setup/start/stop). The modules in scripts/kube/mod/ pin
# the same versions in their go.mod: change both together (the cached binaries are then rebuilt).
KUBE_VERSION=v1.37.2     # k8s.io/kubernetes, its staging modules at v0.37.2
ETCD_VERSION=v3.7.3      # go.etcd.io/etcd/server/v3
KWOK_VERSION=v0.8.0      # sigs.k8s.io/kwok
JOBSET_VERSION=v0.10.1   # sigs.k8s.io/jobset
GO_MIN=1.26
# Bump when the build recipe (flags, layout) changes: every cached binary is rebuilt.
RECIPE=1
KUBE_CACHE_ROOT="${GPUPOOL_KUBE_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/gpupool-kube}"
KUBE_CACHE_DIR="$KUBE_CACHE_ROOT/$KUBE_VERSION"
