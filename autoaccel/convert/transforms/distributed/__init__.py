"""`--to ddp`: DistributedDataParallel scaffolding, one codemod per step, in order.

Each step after `InitProcessGroup` acts only on a script that carries its set-up block
(`DISTRIBUTED`, `RANK`, `LOCAL_RANK`, `WORLD_SIZE`), so a script that could not be set
up is left alone as a whole.
"""

from autoaccel.convert.transforms.distributed.convert_sync_batchnorm import ConvertSyncBatchNorm
from autoaccel.convert.transforms.distributed.agree_on_plateau import AgreeOnPlateau
from autoaccel.convert.transforms.distributed.compute_before_printing import ComputeBeforePrinting
from autoaccel.convert.transforms.distributed.destroy_process_group import DestroyProcessGroup
from autoaccel.convert.transforms.distributed.evaluate_whole import EvaluateWhole
from autoaccel.convert.transforms.distributed.follow_per_process_batch import FollowPerProcessBatch
from autoaccel.convert.transforms.distributed.guard_rank_zero import GuardRankZero
from autoaccel.convert.transforms.distributed.init_process_group import InitProcessGroup
from autoaccel.convert.transforms.distributed.launch_commands import LaunchCommands
from autoaccel.convert.transforms.distributed.load_on_every_rank import LoadOnEveryRank
from autoaccel.convert.transforms.distributed.log_on_rank_zero import LogOnRankZero
from autoaccel.convert.transforms.distributed.migrate_horovod import MigrateHorovod
from autoaccel.convert.transforms.distributed.migrate_launch import MigrateLaunch
from autoaccel.convert.transforms.distributed.name_train_loader import NameTrainLoader
from autoaccel.convert.transforms.distributed.no_sync_accumulation import NoSyncAccumulation
from autoaccel.convert.transforms.distributed.order_sets_alike import OrderSetsAlike
from autoaccel.convert.transforms.distributed.print_shard_sizes import PrintShardSizes
from autoaccel.convert.transforms.distributed.refuse_split_pairs import RefuseSplitPairs
from autoaccel.convert.transforms.distributed.progress_on_rank_zero import ProgressOnRankZero
from autoaccel.convert.transforms.distributed.replace_data_parallel import ReplaceDataParallel
from autoaccel.convert.transforms.distributed.scale_summed_loss import ScaleSummedLoss
from autoaccel.convert.transforms.distributed.seed_each_rank import SeedEachRank
from autoaccel.convert.transforms.distributed.set_sampler_epoch import SetSamplerEpoch
from autoaccel.convert.transforms.distributed.shard_batch_rounds import ShardBatchRounds
from autoaccel.convert.transforms.distributed.shard_evaluation import ShardEvaluation
from autoaccel.convert.transforms.distributed.shard_permuted_rows import ShardPermutedRows
from autoaccel.convert.transforms.distributed.shard_stream_columns import ShardStreamColumns
from autoaccel.convert.transforms.distributed.shard_train_loader import ShardTrainLoader
from autoaccel.convert.transforms.distributed.share_node_cpus import ShareNodeCpus
from autoaccel.convert.transforms.distributed.stop_together import StopTogether
from autoaccel.convert.transforms.distributed.sum_printed_totals import SumPrintedTotals
from autoaccel.convert.transforms.distributed.use_local_gpu import UseLocalGpu
from autoaccel.convert.transforms.distributed.wrap_model import WrapModel

DDP_STEPS = [
    MigrateLaunch,  # first: takes out a torch.distributed.launch / apex.parallel set-up
    InitProcessGroup,
    NameTrainLoader,  # before the steps that read the statement which takes the loader
    UseLocalGpu,
    ReplaceDataParallel,
    ConvertSyncBatchNorm,
    SeedEachRank,
    OrderSetsAlike,
    RefuseSplitPairs,
    WrapModel,
    MigrateHorovod,  # after WrapModel: fp16 compression hooks onto the DDP wrapper
    ShardStreamColumns,
    ShardPermutedRows,
    ShardTrainLoader,
    EvaluateWhole,  # after ShardTrainLoader: its loops read the loaders it shards
    ShardBatchRounds,
    FollowPerProcessBatch,
    ShareNodeCpus,
    SetSamplerEpoch,
    PrintShardSizes,
    SumPrintedTotals,  # before GuardRankZero: the sum is taken on every process
    # before ShardEvaluation, which then sees the evaluations a print reported, and
    # before GuardRankZero puts the prints under `if RANK == 0:`
    ComputeBeforePrinting,
    ShardEvaluation,
    NoSyncAccumulation,
    StopTogether,
    AgreeOnPlateau,
    ScaleSummedLoss,
    LogOnRankZero,  # before GuardRankZero, which then leaves the runs it made alone
    ProgressOnRankZero,
    GuardRankZero,
    LoadOnEveryRank,
    DestroyProcessGroup,
    LaunchCommands,
]
