# Sourced by the serving benchmark's peer scripts (bench/*_peer.sh): the arguments they all take and the checks
# before one starts a server.
#
#   peer_args "$@"             PORT PID_FILE [MODEL_DIR] -> $port, $pid_file, $model_dir (default: the bundled
#                              model, `pdrelay model prepare`); the usage and exit 2 with fewer arguments
#   peer_model_has FILE        exit 2 unless $model_dir holds FILE
#   peer_python VAR IMPORTS    $py = ${VAR:-python3}; exit 2 unless it can `import IMPORTS` (then the peer's own
#                              virtualenv is missing: the script's header says how to make one)

peer_args() {
    if [[ $# -lt 2 ]]; then
        echo "usage: $0 PORT PID_FILE [MODEL_DIR]" >&2
        exit 2
    fi
    port=$1
    pid_file=$2
    model_dir=${3:-}
    if [[ -z $model_dir ]]; then
        local pdrelay
        pdrelay=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv/bin/pdrelay
        [[ -x $pdrelay ]] || pdrelay=pdrelay
        model_dir=$("$pdrelay" model prepare 2>/dev/null | tail -n 1)
    fi
}

peer_model_has() {
    if [[ ! -f $model_dir/$1 ]]; then
        echo "$0: no $1 in '$model_dir'; pass MODEL_DIR (a local model directory)" >&2
        exit 2
    fi
}

peer_python() {
    py=${!1:-python3}
    if ! "$py" -c "import $2" 2>/dev/null; then
        echo "$0: '$py' cannot import $2; install it into its own venv (see the top of this script) and set $1" >&2
        exit 2
    fi
}
