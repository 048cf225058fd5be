#!/usr/bin/env bash
# CI: a real one-node Slurm cluster on this machine, and gpulab submitted to it through
# `--profile profiles/slurm`. munged, slurmctld and slurmd are started directly (no systemd), with
# their state, logs and munge key under one temporary directory, and stopped by PID on exit. The
# cluster's slurm.conf and gres.conf go to /etc/slurm for the run (srun inside a job reads only the
# default path: the executor plugin clears SLURM_CONF there) and are removed afterwards; a machine
# that already has a /etc/slurm/slurm.conf is refused, never overwritten.
#
#   .ci/slurm.sh [REFERENCE_RESULTS]
#
# REFERENCE_RESULTS: results/<target> of a local run of the same config (CSV columns are compared);
# without it a local reference run is made first. Needs: slurmctld slurmd slurm-client munge.
#
# Asserts: GPU jobs of two targets land on their partitions with their GPU model and environment; a
# rule failing under Slurm fails the run and its log is shown; the default workflow runs as Slurm jobs
# (job ids in Snakemake's output, COMPLETED in Slurm's job records) while local rules stay on this
# host; its results have the same CSV files and columns as the local run.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
REFERENCE=${1:-}
SECONDS=0
step() { printf '\n--- [slurm %4ds] %s\n' "$SECONDS" "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

for tool in munged slurmctld slurmd sbatch squeue sinfo scontrol; do
  command -v "$tool" >/dev/null || fail "$tool not found: apt-get install slurmctld slurmd slurm-client munge"
done

ETC=/etc/slurm
[ ! -e "$ETC/slurm.conf" ] || fail "$ETC/slurm.conf exists: this machine has a Slurm setup of its own; not touching it"
WORK=$(mktemp -d /tmp/gpulab-slurm.XXXXXX)
PIDS=()
CONF_WRITTEN=()

teardown() {
  local status=$?
  set +e
  if [ "$status" -ne 0 ]; then
    echo "--- slurmctld log (last 40 lines) ---"; tail -n 40 "$WORK/log/slurmctld.log" 2>/dev/null
    echo "--- slurmd log (last 20 lines) ---"; tail -n 20 "$WORK/log/slurmd.log" 2>/dev/null
  fi
  # Jobs first (their slurmstepd exit with them), then the daemons in reverse start order.
  local jobs=()
  [ ${#PIDS[@]} -eq 0 ] || mapfile -t jobs < <(squeue -h -o %i 2>/dev/null)
  if [ ${#jobs[@]} -gt 0 ]; then scancel "${jobs[@]}"; sleep 2; fi
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do kill "${PIDS[$i]}" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
  done
  for f in "${CONF_WRITTEN[@]}"; do cp "$f" "$WORK/etc/" 2>/dev/null; rm -f "$f"; done
  if [ "$status" -eq 0 ]; then rm -rf "$WORK"; else echo "cluster files kept in $WORK"; fi
  exit "$status"
}
trap teardown EXIT
# Killed from outside (CI time-out, Ctrl-C): tear down as a failure, keeping the files.
trap 'exit 143' TERM
trap 'exit 130' INT

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

step "one-node cluster in $WORK"
mkdir -p "$WORK"/{etc,munge,state,spool,log} "$ETC"
chmod 755 "$WORK/munge"
head -c 1024 /dev/urandom >"$WORK/munge/munge.key"
chmod 400 "$WORK/munge/munge.key"
munged --foreground --force --key-file="$WORK/munge/munge.key" --socket="$WORK/munge/munge.socket" \
  --pid-file="$WORK/munge/munged.pid" --seed-file="$WORK/munge/munged.seed" \
  --log-file="$WORK/log/munged.log" >>"$WORK/log/munged.log" 2>&1 &
PIDS+=($!)

HOST=$(hostname -s)
# The node as slurmd sees it, but declared with 8 CPUs and 64 GiB so the profile's default job size
# (4 CPUs, 16 GB) fits twice over on a small CI machine; config_overrides lets slurmd accept that.
node_line=$(slurmd -C | head -n 1 | sed -E 's/ CPUs=[0-9]+//; s/ Boards=[0-9]+//; s/ SocketsPerBoard=[0-9]+//; s/ CoresPerSocket=[0-9]+//; s/ ThreadsPerCore=[0-9]+//; s/ RealMemory=[0-9]+//')
CONF_WRITTEN+=("$ETC/slurm.conf" "$ETC/gres.conf")
cat >"$ETC/slurm.conf" <<EOF
ClusterName=gpulab-ci
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
AuthInfo=socket=$WORK/munge/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd.pid
SlurmctldLogFile=$WORK/log/slurmctld.log
SlurmdLogFile=$WORK/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
ReturnToService=2
# No slurmdbd: finished jobs stay visible to squeue and scontrol for an hour (far over 3x the status
# interval), and every finished job's partition and state is recorded in a text file the test reads.
MinJobAge=3600
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$WORK/log/jobcomp.txt
MpiDefault=none
MailProg=/bin/true
# Two fake GPUs, one per model, so GPU requests (--gpus=1, --gpus=<model>:1) are scheduled for real.
GresTypes=gpu
$node_line CPUs=8 RealMemory=65536 Gres=gpu:mi300x:1,gpu:h100:1 State=UNKNOWN
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName=mi300x Nodes=ALL MaxTime=INFINITE State=UP
PartitionName=h100 Nodes=ALL MaxTime=INFINITE State=UP
EOF
cat >"$ETC/gres.conf" <<EOF
NodeName=$HOST Name=gpu Type=mi300x File=/dev/null
NodeName=$HOST Name=gpu Type=h100 File=/dev/zero
EOF

for _ in $(seq 50); do [ -S "$WORK/munge/munge.socket" ] && break; sleep 0.1; done
[ -S "$WORK/munge/munge.socket" ] || fail "munged did not start (see $WORK/log/munged.log)"
slurmctld -D -i >>"$WORK/log/slurmctld.out" 2>&1 &
PIDS+=($!)
slurmd -D >>"$WORK/log/slurmd.out" 2>&1 &
PIDS+=($!)
for _ in $(seq 60); do
  state=$(sinfo -h -n "$HOST" -o %T 2>/dev/null | head -n 1 || true)
  case "$state" in idle | mixed | allocated) break ;; esac
  sleep 1
done
case "$state" in idle | mixed | allocated) ;; *) fail "node $HOST not ready (state: '${state:-none}')" ;; esac
sinfo -o '%P %N %T %c %m %G'

SNAKEMAKE=(snakemake --profile profiles/slurm --workflow-profile profiles/slurm-ci)

# One finished job's line in Slurm's job completion log.
job_record() { grep -E "^JobId=$1 " "$WORK/log/jobcomp.txt" || true; }

step "two targets, each on its own partition and GPU model; a failing rule"
probe_dir=$WORK/probe
set +e
# Jobs inherit the submitting shell's environment; a target's own value must win over it.
GPULAB_CI_INHERITED=from-submit-host GPULAB_CI_OVERRIDDEN=from-submit-host \
"${SNAKEMAKE[@]}" --snakefile "$REPO/tests/cluster/Snakefile" --directory "$probe_dir" \
  --configfile "$REPO/tests/cluster/targets.yaml" --keep-going >"$WORK/probe.out" 2>&1
probe_status=$?
set -e
cat "$WORK/probe.out"
[ "$probe_status" -ne 0 ] || fail "the run with a failing rule exited 0"
# The marker is assembled by the failing command, so only the shown log can contain it verbatim.
grep -A 2 -E "^Logfile .*probe_fail\.log:" "$WORK/probe.out" | grep -q "gpulab-ci: deliberate failure in probe_fail" \
  || fail "the failing rule's log was not shown in Snakemake's output"
fail_id=$(sed -nE "s/.*SLURM-job '([0-9]+)' failed.*/\1/p" "$WORK/probe.out" | head -n 1)
[ -n "$fail_id" ] || fail "Snakemake did not report the failed Slurm job"
job_record "$fail_id" | grep -q "JobState=FAILED" || fail "Slurm has no FAILED record of job $fail_id"
python3 tests/cluster/slurm_checks.py probe tests/cluster/targets.yaml "$probe_dir/results"

step "the default workflow through the profile"
run_dir=$WORK/run
set +e
"${SNAKEMAKE[@]}" --snakefile "$REPO/Snakefile" --configfile "$REPO/config.yaml" --directory "$run_dir" \
  --config report="{output: $run_dir/reports/report.html}" >"$WORK/run.out" 2>&1
run_status=$?
set -e
cat "$WORK/run.out"
[ "$run_status" -eq 0 ] || fail "the default workflow failed under Slurm"
test -s "$run_dir/reports/report.html" || fail "no report"

python3 tests/cluster/slurm_checks.py jobs "$WORK/run.out"

step "the same CSV files and columns as a local run"
if [ -z "$REFERENCE" ]; then
  ref_dir=$WORK/local
  snakemake --cores "$(nproc)" --snakefile "$REPO/Snakefile" --configfile "$REPO/config.yaml" --directory "$ref_dir" \
    --config report="{output: $ref_dir/reports/report.html}" >"$WORK/local.out" 2>&1 \
    || { tail -n 50 "$WORK/local.out"; fail "the local reference run failed"; }
  REFERENCE=$ref_dir/results/local
fi
python3 tests/cluster/slurm_checks.py schema "$REFERENCE" "$run_dir/results/local"

step "slurm: all checks passed"
