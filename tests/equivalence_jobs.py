"""test_equivalence.py's jobs as data, without TensorFlow: conftest's scheduler reads them to
keep each job's tests on one xdist worker (its fixture runs the job once) while the module's
jobs spread over both workers."""
from typing import Optional

TWO_MACHINES = "127.0.0.1:0,1;127.0.0.2:0,1"
TENSORFLOW = ["--collectives", "tensorflow"]

# A part is a setting (a run option and Config's options) and the models trained in it, each
# in its turns of the configurations: part: (models, arguments).
PARTS = {
    "AR": (["dense", "sparse", "keras", "lstm", "lookup-sparse", "seq2seq"],
           ["--run-option", "MPI"]),  # the paper's name of AR
    "PS": (["sparse", "lstm", "seq2seq"], ["--run-option", "PS"]),
    # The embedding's gradient fetched with the train op, as a script inspects it: the
    # aggregate, whole (and stitched from its shards in the split parts below).
    # A Keras 3 Embedding layer (the text-classification tutorials'): its gather's gradient
    # is sparse, so the table goes to a server and the Dense kernels are allreduced.
    "HYBRID": (["sparse", "lstm", "keras-embedding", "lookup-sparse", "seq2seq"],
               ["--run-option", "HYBRID", "--fetch-gradients"]),
    # Ids made unique before the lookup (embedding_lookup_sparse): one device's gradient has
    # a row per distinct id of the combined batch, and clip_by_global_norm its norm.
    "PS-no-local-aggregation": (["sparse", "lookup-sparse"],
                                ["--run-option", "PS", "--ps-off", "local_aggregation"]),
    # On the Horovod stack, TensorFlow's own collective ops too (the default stack's AR and
    # HYBRID parts run them), in a Python without Horovod: dense gradients packed in buckets,
    # sparse ones gathered padded, the broadcast, the state combined (keras' moving statistics,
    # the loss denominators).
    "AR-tensorflow": (["dense", "sparse", "keras", "lstm", "lookup-sparse", "seq2seq"],
                      ["--run-option", "AR", *TENSORFLOW]),
    "PS-no-optimizations": (["sparse"], [
        "--run-option", "PS", "--ps-off", "local_aggregation", "post_aggregation_placement",
        "boundary_between_workers_and_servers"]),
    "HYBRID-no-local-aggregation": (["sparse"],
                                    ["--run-option", "HYBRID", "--ps-off", "local_aggregation"]),
    # Dense gradients allreduced in machine stages (rewriting/machine_allreduce.py).
    "AR-machine-stages": (["dense"], ["--run-option", "AR", "--hierarchical-allreduce"]),
    "AR-machine-stages-tensorflow": (["dense"], ["--run-option", "AR",
                                                 "--hierarchical-allreduce", *TENSORFLOW]),
    "HYBRID-lstm-machine-stages": (["lstm"], ["--run-option", "HYBRID",
                                              "--hierarchical-allreduce"]),
    # Horovod joined without the stages' process sets (idle, they cost CPU every cycle), again
    # with them for a later runner in stages, and again after leaving it (AUTO's trials leave
    # it when the plan they keep needs none).
    "AR-rejoining-horovod": (["dense"], ["--run-option", "AR", "--rejoin-horovod"]),
    # Both kinds of sparse synchronization in one plan, which the trials run beside the rules'
    # plans, switching every few steps (test_auto_weighs_...).
    "AUTO-two-tables": (["two-tables"], ["--run-option", "AUTO", "--trial-steps", "3"]),
    # The embedding, which the user did not partition, split over both servers
    # (Config.split_variables, rewriting/split_variables.py); its checkpoints load into the
    # single-device graph.
    "HYBRID-split": (["sparse"], ["--run-option", "HYBRID", "--split-variables",
                                  "--checkpoint", "--fetch-gradients"]),
    "HYBRID-keras-embedding-split": (["keras-embedding"], [
        "--run-option", "HYBRID", "--split-variables", "--ps-off", "local_aggregation",
        "--fetch-gradients"]),
    # A loss normalized by the tokens that are not padding, each worker's count its own:
    # divided by the combined batch's count, as on one device (passes/loss_denominators.py).
    # Its trials the shortest (Config.trial_steps=3): every plan is tried within the first
    # runner's steps, and the training goes on through the switches.
    "AUTO-seq2seq": (["seq2seq"], ["--run-option", "AUTO", "--trial-steps", "3"]),
}
# A job trains its parts one after another (the parts its selected tests need), one
# get_runner a configuration: one job per cluster and collectives library, launched for its
# first part's graph (so a part with servers goes first). The parts whose steps use no
# collectives go before those whose steps do: once a runner's steps use them, the process
# keeps them joined (PS-lstm's test sees each runner leave them). A part the driver decides
# for (AUTO, split_variables) is a job of its own: a job's later get_runner calls take the
# decision of its first.
JOBS = {  # job: (resources, parts)
    "one-machine": ("localhost:0,1", ["AR"]),
    "two-machines": (TWO_MACHINES, ["PS", "PS-no-local-aggregation", "PS-no-optimizations",
                                    "HYBRID", "HYBRID-no-local-aggregation",
                                    "HYBRID-lstm-machine-stages", "AR-machine-stages"]),
    "one-machine-tensorflow": ("localhost:0,1", ["AR-tensorflow"]),
    **{part: (TWO_MACHINES, [part]) for part in (
        "AR-machine-stages-tensorflow", "AR-rejoining-horovod", "AUTO-two-tables",
        "HYBRID-split", "HYBRID-keras-embedding-split", "AUTO-seq2seq")},
}
JOB_OF_PART = {part: job for job, (_, parts) in JOBS.items() for part in parts}
# The tests' cases: a part's model (named by the part alone where it has one model).
CASES = {(part if len(models) == 1 else f"{part}-{model}"): (part, model)
         for part, (models, _) in PARTS.items() for model in models}


def job_of_test(nodeid: str) -> Optional[str]:
    """The job whose fixture a test of test_equivalence.py takes (from its id's case, the
    longest case its parameters start with), or None for a test that takes no job."""
    if "[" not in nodeid or not nodeid.startswith("tests/test_equivalence.py::"):
        return None
    params = nodeid.split("[", 1)[1].rstrip("]")
    cases = [case for case in CASES if params == case or params.startswith(case + "-")]
    return JOB_OF_PART[CASES[max(cases, key=len)][0]] if cases else None
