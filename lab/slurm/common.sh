# What the recipes in lab/slurm/ do the same way. Each recipe sources this file once it is in the
# repository root, and then calls the three functions below, in this order:
#   ranks_per_node N          how many ranks each node's torchrun starts (PER_NODE)
#   need_world ... / need_world_dividing ...    refuse a job the lab cannot run, before anything starts
#   head_address              where the ranks meet: the first node's address and a port (HEAD_ADDR, RDZV_PORT)
# Every value is exported: the recipe's `srun bash -c '...'` reads them on every node.

# The course's python and torchrun (make install puts them in .venv/bin). Another environment:
#   VENV_BIN=/path/to/env/bin sbatch lab/slurm/01_ddp.sbatch
export VENV_BIN=${VENV_BIN:-.venv/bin}
# Each rank's output in a file of its own: one folder per job, one per node inside it (torchrun adds
# a folder per attempt and one per local rank: out/slurm/JOB/node1/JOB_xxx/attempt_0/0/stdout.log).
export LOGS=${LOGS:-out/slurm/$SLURM_JOB_ID}

# A job this recipe cannot run: one line on stderr (the job's output file), exit status 2.
refuse() {
    echo "${SLURM_JOB_NAME:-$(basename "$0")}: error: $*" >&2
    exit 2
}

# ranks_per_node N: one rank per GPU when Slurm gave the node GPUs (--gpus-per-node); on CPUs,
# RANKS_PER_NODE when set, else the lab's N ranks spread over the job's nodes. One task per node
# is the other half of the contract: srun starts one torchrun on each node, and torchrun, not
# Slurm, starts that node's ranks.
ranks_per_node() {
    [ "${SLURM_NTASKS:-$SLURM_JOB_NUM_NODES}" = "$SLURM_JOB_NUM_NODES" ] ||
        refuse "$SLURM_NTASKS tasks on $SLURM_JOB_NUM_NODES nodes: the recipe starts one torchrun per node" \
            "(which starts the node's ranks itself); submit with --ntasks-per-node=1, as its #SBATCH line says," \
            "and set the ranks with RANKS_PER_NODE or --gpus-per-node"
    if [ -n "${SLURM_GPUS_ON_NODE:-}" ]; then
        PER_NODE=$SLURM_GPUS_ON_NODE
    else
        PER_NODE=${RANKS_PER_NODE:-$(($1 / SLURM_JOB_NUM_NODES))}
    fi
    case $PER_NODE in
        "" | *[!0-9]* | 0) refuse "$PER_NODE ranks per node on $SLURM_JOB_NUM_NODES nodes: set RANKS_PER_NODE to 1 or more" ;;
    esac
    export PER_NODE
    WORLD=$((SLURM_JOB_NUM_NODES * PER_NODE))
}

# need_world N WHAT: the lab runs on exactly N ranks (WHAT: the layouts that give them).
need_world() {
    [ "$WORLD" = "$1" ] ||
        refuse "$SLURM_JOB_NUM_NODES nodes x $PER_NODE per node = $WORLD ranks; the lab needs $1: $2"
}

# need_world_dividing BATCH ARGS...: the lab cuts its global batch (BATCH rows, or --batch-size in
# ARGS) evenly over the ranks, so the world size must divide it.
need_world_dividing() {
    local batch=$1 prev='' fits
    shift
    for arg in "$@"; do
        case $prev in --batch-size) batch=$arg ;; esac
        case $arg in --batch-size=*) batch=${arg#*=} ;; esac
        prev=$arg
    done
    fits=$(for n in $(seq 2 16); do [ $((batch % n)) != 0 ] || printf '%s ' "$n"; done)
    [ $((batch % WORLD)) = 0 ] ||
        refuse "$SLURM_JOB_NUM_NODES nodes x $PER_NODE per node = $WORLD ranks, which do not divide the global" \
            "batch of $batch rows; use a world size that divides it: ${fits}ranks"
}

# head_address: the rendezvous runs on the first node of the job (torchrun's c10d store, hosted by
# that node's torchrun). Its address is what the cluster's resolver gives for the node's name, or,
# when the name does not resolve or resolves to loopback (127.0.1.1 in some /etc/hosts), the first
# IPv4 address the node itself reports. HEAD_ADDR and RDZV_PORT, when set, are taken as they are.
head_address() {
    local head
    head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
    if [ -z "${HEAD_ADDR:-}" ]; then
        HEAD_ADDR=$(getent hosts "$head" | awk '{ print $1; exit }')
        case $HEAD_ADDR in
            "" | 127.* | ::1)
                HEAD_ADDR=$(srun --nodes=1 --ntasks=1 -w "$head" hostname -I | tr ' ' '\n' | grep -m 1 '\.') ;;
        esac
        [ -n "$HEAD_ADDR" ] || [ "$SLURM_JOB_NUM_NODES" != 1 ] || HEAD_ADDR=127.0.0.1   # one node: loopback will do
    fi
    [ -n "$HEAD_ADDR" ] || refuse "no address found for the first node $head; set HEAD_ADDR to one the other nodes reach"
    # a port of its own for each job, so that two jobs that share a first node do not meet
    RDZV_PORT=${RDZV_PORT:-$((29500 + SLURM_JOB_ID % 1000))}
    export HEAD_ADDR RDZV_PORT
    echo "$SLURM_JOB_NAME: $SLURM_JOB_NUM_NODES nodes ($SLURM_JOB_NODELIST) x $PER_NODE ranks;" \
        "rendezvous on $head at $HEAD_ADDR:$RDZV_PORT; each rank's log in $LOGS/"
}
