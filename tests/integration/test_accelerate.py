"""muster --accelerate-config (issue 34) against `accelerate launch
--config_file` of accelerate 1.14 in Debian sid's PyTorch 2.14 root
(torch2.py): the same workers, each seeing the same variables, and a small
accelerate training script ending with the same weights. Skipped, with the
reason, where the root is not built or the tests do not run as root.

The reference is accelerate itself (accelerate_debian.py: unchanged but for
torchrun's TCPStore without libuv, and a stand-in for DeepSpeed, which
Debian does not package and whose single-node launch is torchrun's)."""
import json
import os
import shlex
import shutil
import subprocess
import unittest

import torch2
from harness import HERE, ROOT as REPO, TempDirTest, reserve_port

# Differences between muster and torchrun, as test_torch2 explains them.
EXPLAINED = {
    "TORCHELASTIC_USE_AGENT_STORE": ("False", "True"),
    "NCCL_ASYNC_ERROR_HANDLING": ("1", None),
}
PER_RUN = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"}
MUSTER_ONLY = {"MUSTER_PROGRESS_FILE"}

MULTI_GPU = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_GPU
downcast_bf16: 'no'
dynamo_config:
  dynamo_backend: INDUCTOR
  dynamo_mode: max-autotune
  dynamo_use_dynamic: true
  dynamo_use_fullgraph: false
enable_cpu_affinity: true
gpu_ids: all
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""

FSDP = """\
compute_environment: LOCAL_MACHINE
debug: true
distributed_type: FSDP
downcast_bf16: 'no'
fsdp_config:
  fsdp_activation_checkpointing: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: true
  fsdp_offload_params: false
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_transformer_layer_cls_to_wrap: BertLayer
  fsdp_version: 2
machine_rank: 0
main_training_function: main
mixed_precision: fp16
num_machines: 1
num_processes: 2
parallelism_config:
  parallelism_config_cp_size: 1
  parallelism_config_dp_replicate_size: 1
  parallelism_config_dp_shard_size: 2
  parallelism_config_tp_size: 1
rdzv_backend: static
same_network: true
use_cpu: false
"""

DEEPSPEED = """\
{
  "compute_environment": "LOCAL_MACHINE",
  "deepspeed_config": {
    "gradient_accumulation_steps": 4,
    "gradient_clipping": 1.0,
    "offload_optimizer_device": "CPU",
    "offload_param_device": "none",
    "zero3_init_flag": true,
    "zero3_save_16bit_model": true,
    "zero_stage": 3
  },
  "distributed_type": "DEEPSPEED",
  "gpu_ids": "0,1",
  "machine_rank": 0,
  "mixed_precision": "bf16",
  "num_machines": 1,
  "num_processes": 2
}
"""

WHY_NOT = torch2.TORCH214.available()


@unittest.skipIf(WHY_NOT, WHY_NOT)
class Accelerate(torch2.WithBundle, TempDirTest):
    """muster --accelerate-config and accelerate launch --config_file, side by side."""

    ROOT = torch2.TORCH214

    def setUp(self):
        super().setUp()
        for script in (os.path.join(HERE, "accelerate_debian.py"),
                       os.path.join(HERE, "torchrun_debian.py"),
                       os.path.join(REPO, "examples", "accelerate_train.py")):
            shutil.copy(script, self.tmp)
        shutil.copytree(os.path.join(HERE, "nolibuv"), self.path("nolibuv"))

    def command(self, launcher, config, *args):
        """`launcher` ("muster" or "accelerate") with the config file
        `config` (a name in self.tmp), from self.tmp: the root's command line."""
        if launcher == "muster":
            command = ["/opt/muster/bin/muster", "--accelerate-config", config, *args]
        else:
            command = ["/usr/bin/python3", "accelerate_debian.py", "--config_file", config,
                       *[a.replace("--no-python", "--no_python") for a in args]]
        return ["/bin/sh", "-c", f"cd {shlex.quote(self.tmp)} && exec {shlex.join(command)}"]

    def launch(self, launcher, config, *args, **extra_env):
        """command() run in the root; its CompletedProcess."""
        return self.ROOT.run(self.command(launcher, config, *args), self.bundle, self.tmp,
                             torch2.root_env(**extra_env), timeout=240)

    def write(self, name, text):
        with open(self.path(name), "w") as f:
            f.write(text)
        return name

    def environments(self, launcher, config):
        out = self.path(f"env-{launcher}-{config}")
        os.mkdir(out)
        result = self.launch(launcher, config, "--no-python", "/bin/sh", "-c",
                             f"env > {out}/env.$LOCAL_RANK")
        self.assertEqual(result.returncode, 0, f"{launcher}: {result.stderr}")
        return torch2.read_environments(out, 2)

    def assert_same_environment(self, config):
        ours, theirs = self.environments("muster", config), self.environments("accelerate", config)
        torch2.assert_same_environments(self, ours, theirs, EXPLAINED, PER_RUN, MUSTER_ONLY)
        return ours

    def test_a_multi_gpu_config_with_bf16_and_dynamo_gives_accelerates_variables(self):
        ours = self.assert_same_environment(self.write("multi_gpu.yaml", MULTI_GPU))
        self.assertEqual(ours[0]["ACCELERATE_MIXED_PRECISION"], "bf16")
        self.assertEqual(ours[0]["ACCELERATE_DYNAMO_BACKEND"], "INDUCTOR")
        self.assertEqual(ours[1]["WORLD_SIZE"], "2")

    def test_an_fsdp_config_with_parallelism_gives_accelerates_variables(self):
        ours = self.assert_same_environment(self.write("fsdp.yaml", FSDP))
        self.assertEqual(ours[0]["FSDP_VERSION"], "2")
        self.assertEqual(ours[0]["PARALLELISM_CONFIG_DP_SHARD_SIZE"], "2")

    def test_a_deepspeed_json_config_gives_accelerates_variables(self):
        ours = self.assert_same_environment(self.write("deepspeed.json", DEEPSPEED))
        self.assertEqual(ours[0]["ACCELERATE_DEEPSPEED_ZERO_STAGE"], "3")
        self.assertEqual(ours[0]["CUDA_VISIBLE_DEVICES"], "0,1")

    def test_a_training_script_ends_with_accelerates_weights(self):
        # (accelerate config quotes it: plain NO is YAML 1.1's false.)
        config = self.write("multi_gpu.yaml", MULTI_GPU.replace("INDUCTOR", "'NO'"))
        records = {}
        for launcher in ("muster", "accelerate"):
            out = self.path(f"{launcher}.json")
            # accelerate's workers reach torchrun's own store as clients
            # that ask for the libuv Debian's build lacks (nolibuv/).
            extra = {"PYTHONPATH": os.path.join(self.tmp, "nolibuv")} if launcher != "muster" else {}
            result = self.launch(launcher, config, "accelerate_train.py", "--out", out, **extra)
            self.assertEqual(result.returncode, 0, f"{launcher}: {result.stderr}")
            with open(out) as f:
                records[launcher] = json.load(f)
        self.assertEqual(records["muster"]["mixed_precision"], "bf16")
        self.assertEqual(records["muster"], records["accelerate"])
        # The control: without the file's bf16 the weights are not these.
        plain = self.path("plain.json")
        result = self.ROOT.run(
            ["/bin/sh", "-c", f"cd {shlex.quote(self.tmp)} && exec /opt/muster/bin/muster "
             f"--nproc-per-node 2 accelerate_train.py --out {plain}"],
            self.bundle, self.tmp, torch2.root_env(), timeout=240)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(plain) as f:
            self.assertNotEqual(json.load(f)["params"], records["muster"]["params"])

    def test_two_machines_give_accelerates_ranks_and_variables(self):
        # Two machines on this host: machine 1 says its rank as each
        # launcher spells it (accelerate's --machine_rank, muster's --node-rank).
        port = reserve_port()
        config = self.write("two.yaml", MULTI_GPU.replace("num_machines: 1", "num_machines: 2")
                            .replace("num_processes: 2", "num_processes: 4")
                            + f"main_process_ip: 127.0.0.1\nmain_process_port: {port}\n")
        envs = {}
        for launcher in ("muster", "accelerate"):
            out = self.path(f"two-{launcher}")
            os.mkdir(out)
            rank_flag = ["--node-rank", "1"] if launcher == "muster" else ["--machine_rank", "1"]
            script = ["--no-python", "/bin/sh", "-c", f"env > {out}/env.$RANK"]
            procs = [self.start(launcher, config, *script),
                     self.start(launcher, config, *rank_flag, *script)]
            for proc in procs:
                _, err = proc.communicate(timeout=240)
                self.assertEqual(proc.returncode, 0, f"{launcher}: {err}")
            envs[launcher] = torch2.read_environments(out, 4)
        # muster's MASTER_PORT is its own --master-port (docs/accelerate.md).
        torch2.assert_same_environments(self, envs["muster"], envs["accelerate"], EXPLAINED,
                                        PER_RUN, MUSTER_ONLY)
        self.assertEqual([e["GROUP_RANK"] for e in envs["muster"]], ["0", "0", "1", "1"])
        self.assertEqual({e["WORLD_SIZE"] for e in envs["muster"]}, {"4"})

    def start(self, launcher, config, *args):
        """launch()'s command in the background; a Popen with text pipes."""
        command = self.command(launcher, config, *args)
        return subprocess.Popen(self.ROOT.enter_argv(command, self.bundle, self.tmp),
                                env=torch2.root_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)

    def test_muster_flags_win_over_the_file(self):
        config = self.write("multi_gpu.yaml", MULTI_GPU)
        out = self.path("env")
        os.mkdir(out)
        result = self.launch("muster", config, "--nproc-per-node", "3", "--no-python", "/bin/sh",
                             "-c", f"env > {out}/env.$LOCAL_RANK")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(sorted(os.listdir(out)), ["env.0", "env.1", "env.2"])

    def test_the_default_config_is_accelerates_under_hf_home(self):
        os.makedirs(self.path("hf/accelerate"))
        self.write("hf/accelerate/default_config.yaml", MULTI_GPU)
        out = self.path("env")
        os.mkdir(out)
        result = self.launch("muster", "default", "--no-python", "/bin/sh", "-c",
                             f"echo $ACCELERATE_MIXED_PRECISION > {out}/mp.$LOCAL_RANK",
                             HF_HOME=self.path("hf"))
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(out, "mp.1")) as f:
            self.assertEqual(f.read(), "bf16\n")

    def test_a_config_for_another_launcher_is_refused_naming_it(self):
        config = self.write("tpu.yaml", "compute_environment: LOCAL_MACHINE\n"
                                        "distributed_type: XLA\nnum_processes: 8\n")
        result = self.launch("muster", config, "--no-python", "/bin/true")
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("distributed_type XLA runs on TPUs", result.stderr)
        self.assertIn("accelerate launch --config_file", result.stderr)

    def test_an_unknown_key_is_named_in_one_warning(self):
        config = self.write("odd.yaml", MULTI_GPU + "colour: blue\nflavour: sour\n")
        result = self.launch("muster", config, "--no-python", "/bin/true")
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = [line for line in result.stderr.splitlines() if "ignoring" in line]
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertIn("colour, flavour", lines[0])


if __name__ == "__main__":
    unittest.main()
