"""Checks that span several fields or look outside the config: files, registries, devices.

Pure: every check only reads; problems are returned, never raised one by one, never fixed silently.
A config that will fail at run time should fail here, before any model is loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trivium.config.errors import Problem, join_path
from trivium.config.schema import TriviumConfig
from trivium.config.schema_data import looks_like_hub_id
from trivium.validation.validate_data import check_data_pipeline
from trivium.validation.validate_layout import check_layout, preset_or_none
from trivium.validation.validate_monitor import check_monitor
from trivium.validation.validate_tasks import check_stage_data


def resolve_paths(cfg: TriviumConfig, base_dir: Path) -> TriviumConfig:
    """Make data and model paths absolute, relative to the config file's folder.

    A relative ``model.path`` that does not exist there is kept as written: it may be a hub id.
    """

    def local(p: str) -> str:
        if not p or Path(p).is_absolute():
            return p
        return str((base_dir / p).resolve())

    def model_path(p: str | None, force_local: bool = False) -> str | None:
        if not p or Path(p).is_absolute():
            return p
        candidate = base_dir / p
        if candidate.exists() or p.startswith(".") or force_local:
            return str(candidate.resolve())
        return p

    data = cfg.model_dump()
    data["model"]["path"] = model_path(data["model"]["path"], force_local=data["model"]["tiny"] is not None)
    for aux in data["auxiliary_models"]:
        aux["path"] = model_path(aux["path"])
    data["algorithm"]["critic"]["path"] = model_path(data["algorithm"]["critic"]["path"])
    if data["model"]["tiny"] is not None:
        data["model"]["tiny"]["corpus"] = [local(p) for p in data["model"]["tiny"]["corpus"]]
    if (
        data["buffer"]["storage"] is not None
        and data["buffer"]["storage"]["url"]
        and "://" not in data["buffer"]["storage"]["url"]
    ):
        data["buffer"]["storage"]["url"] = local(data["buffer"]["storage"]["url"])
    if data["synchronizer"]["checkpoint_dir"]:
        data["synchronizer"]["checkpoint_dir"] = local(data["synchronizer"]["checkpoint_dir"])
    if data["bench"]["checkpoint_dir"]:
        data["bench"]["checkpoint_dir"] = local(data["bench"]["checkpoint_dir"])
    buf = data["buffer"]
    datasets = [buf["sft_dataset"], buf["preference_dataset"], buf["expert_dataset"]]
    for ts in [
        buf["taskset"],
        *buf["tasksets"],
        *buf["eval_tasksets"],
        *datasets,
    ]:  # a hub id stays as written
        if ts is not None and not looks_like_hub_id(ts["path"], base_dir):
            ts["path"] = local(ts["path"])
    return TriviumConfig.model_validate(data)


def check_semantics(cfg: TriviumConfig, prefix: str = "", check_files: bool = True) -> list[Problem]:
    def at(path: str) -> str:
        return join_path(prefix, path) if prefix else path

    problems: list[Problem] = []
    problems += _check_model(cfg, at, check_files)
    problems += _check_algorithm(cfg, at)
    problems += check_stage_data(cfg, at, check_files)
    problems += _check_serve(cfg, at)
    problems += check_layout(cfg, at, check_files)
    problems += check_monitor(cfg, at)
    problems += check_data_pipeline(cfg, at)
    return problems


def config_notes(cfg: TriviumConfig) -> list[str]:
    """Advice on a valid config: what it will do that its author may not expect (not an error).
    ``trivium check-config`` prints them, and the run that meets the case logs them."""
    from trivium.algorithm.advantages import GROUP_BASELINE_FNS

    notes = []
    preset = preset_or_none(cfg)
    advantage = cfg.algorithm.advantage_fn or (preset.advantage_fn if preset is not None else None)
    if cfg.mode == "serve" and advantage in GROUP_BASELINE_FNS:
        notes.append(
            f"the train process of this serve config computes {advantage!r} advantages against each call's "
            "group of choices: a call with one choice (n = 1, most clients) is a group of one with no "
            "baseline, so its advantage is its bare reward (REINFORCE without a baseline, which reinforces "
            "every reply when rewards are positive). For single-choice traffic use algorithm.algorithm_type: "
            "reinforceplusplus (a batch-wide baseline); for GRPO ask for n >= 2 choices and reward each"
        )
    loss = cfg.algorithm.policy_loss_fn or (preset.policy_loss_fn if preset is not None else None)
    stale_aware = loss == "m2po" or (cfg.algorithm.rollout_is_cap or 0.0) > 0
    if cfg.mode == "both" and cfg.synchronizer.sync_offset >= 2 and not stale_aware and preset is not None:
        ahead = cfg.synchronizer.sync_offset + cfg.synchronizer.sync_interval - 1
        notes.append(
            f"synchronizer.sync_offset: {cfg.synchronizer.sync_offset} trains on samples up to {ahead} updates "
            f"old, and {preset.name!r} corrects nothing for that (its ratio is against the trainer's own weights): "
            "at offset 3 the quickstart's GRPO gained +3 points instead of +66 (docs/recipes.md). Set "
            "algorithm.algorithm_type: m2po (+60 there) or algorithm.rollout_is_cap: 2 (+46), or a smaller offset"
        )
    return notes


def _check_serve(cfg: TriviumConfig, at) -> list[Problem]:
    """Mode serve records into a SQL buffer and follows the weights of a separate train process."""

    if cfg.mode != "serve":
        return []
    out = []
    if cfg.buffer.storage is None:
        out.append(
            Problem(
                at("buffer.storage"),
                None,
                "mode 'serve' records every call into a persistent SQL buffer, rewarded later by /feedback",
                "set buffer.storage (e.g. {} for a SQLite file in the run folder, or url: postgresql+psycopg2://...)",
            )
        )
    if cfg.synchronizer.method != "checkpoint":
        out.append(
            Problem(
                at("synchronizer.method"),
                cfg.synchronizer.method,
                "mode 'serve' picks up the weights that a separate train process publishes as files",
                "use method: checkpoint (the same config in mode train publishes them)",
            )
        )
    return out + _check_serve_safety(cfg, at)


def _check_serve_safety(cfg: TriviumConfig, at) -> list[Problem]:
    """An API key that exists and is not blank, required off loopback; reward bounds in order."""
    import os

    from trivium.net import is_loopback

    s, out = cfg.serve, []
    if s.api_key_env and not os.environ.get(s.api_key_env, "").strip():
        out.append(
            Problem(
                at("serve.api_key_env"),
                s.api_key_env,
                "this environment variable holds the API key, but it is not set, empty or only whitespace",
                f"export {s.api_key_env}=<key> before starting, or set serve.api_key_env: '' to serve without a "
                "key on 127.0.0.1",
            )
        )
    if not s.api_key_env and not is_loopback(s.host):
        out.append(
            Problem(
                at("serve.host"),
                s.host,
                "a host other than loopback serves other machines, and no API key is set: anybody could use "
                "the model and write into its training data",
                "set serve.api_key_env (clients send Authorization: Bearer <key>), or host: 127.0.0.1",
            )
        )
    if s.reward_min >= s.reward_max:
        out.append(
            Problem(
                at("serve.reward_min"),
                s.reward_min,
                f"must be below serve.reward_max ({s.reward_max})",
                "e.g. reward_min: -1, reward_max: 1",
            )
        )
    return out


def _check_model(cfg: TriviumConfig, at, check_files: bool) -> list[Problem]:
    out = []
    m = cfg.model
    if not m.path and m.tiny is None:
        out.append(
            Problem(
                at("model.path"),
                m.path,
                "a model is required",
                "set model.path to a local Hugging Face folder, or model.tiny to create a tiny model",
            )
        )
    looks_like_hub_id = m.path.count("/") == 1 and not m.path.startswith((".", "/"))
    if check_files and m.path and m.tiny is None and not Path(m.path).exists() and not looks_like_hub_id:
        out.append(
            Problem(
                at("model.path"),
                m.path,
                "model folder not found",
                "check the path, or create a tiny test model with `trivium make-tiny PATH`",
            )
        )
    elif check_files and m.path and m.tiny is None and Path(m.path).exists():
        wrong = _model_folder_problem(m.path)
        if wrong:
            out.append(Problem(at("model.path"), m.path, *wrong))
    if m.tiny is not None:
        t = m.tiny
        if t.hidden_size % t.num_heads:
            out.append(
                Problem(
                    at("model.tiny.num_heads"),
                    t.num_heads,
                    "must divide hidden_size",
                    f"hidden_size is {t.hidden_size}",
                )
            )
        if t.num_heads % t.num_kv_heads:
            out.append(
                Problem(
                    at("model.tiny.num_kv_heads"),
                    t.num_kv_heads,
                    "must divide num_heads",
                    f"num_heads is {t.num_heads}",
                )
            )
        if not t.corpus:
            out.append(
                Problem(
                    at("model.tiny.corpus"),
                    t.corpus,
                    "the tokenizer needs a corpus",
                    "list one or more JSON/JSONL files whose text the tokenizer should learn",
                )
            )
        for i, p in enumerate(t.corpus):
            if check_files and not Path(p).exists():
                out.append(Problem(at(f"model.tiny.corpus[{i}]"), p, "file not found", "check the path"))
    from trivium.models.loading import resolve_device

    try:  # the run's own parsing and checks (torch's 'Invalid device string' traceback otherwise)
        resolve_device(m.device)
    except ValueError as error:
        out.append(
            Problem(
                at("model.device"),
                m.device,
                str(error),
                "use device: auto (CUDA where there is a GPU, else cpu), cpu, cuda, cuda:N or mps",
            )
        )
    return out


def _model_folder_problem(path: str) -> tuple[str, str] | None:
    """What is wrong with a local ``model.path`` that exists (None: it holds a model or a LoRA adapter)."""
    from trivium.models.lora import is_adapter_folder

    folder = Path(path)
    if not folder.is_dir():
        return (
            "not a folder: model.path names a Hugging Face model folder (config.json and the weights)",
            "give the folder that holds config.json (a checkpoint's model/ folder works too)",
        )
    if not (folder / "config.json").is_file() and not is_adapter_folder(folder):
        return (
            "the folder holds no model: no config.json (nor a LoRA adapter's adapter_config.json) in it",
            "give the folder that holds config.json and the weights, e.g. the one save_pretrained wrote",
        )
    return None


def _check_algorithm(cfg: TriviumConfig, at) -> list[Problem]:
    from trivium.algorithm.presets import PRESETS
    from trivium.algorithm.registry import ADVANTAGE_FNS, AGGREGATIONS, POLICY_LOSS_FNS
    from trivium.trainer.layout import why_not_shared

    out = []
    a = cfg.algorithm
    problem = PRESETS.problem(a.algorithm_type)
    if problem:
        return [Problem(at("algorithm.algorithm_type"), a.algorithm_type, problem.rule, problem.fix)]
    preset = PRESETS.get(a.algorithm_type)
    for field, registry in (
        ("advantage_fn", ADVANTAGE_FNS),
        ("policy_loss_fn", POLICY_LOSS_FNS),
        ("loss_agg_mode", AGGREGATIONS),
    ):
        name = getattr(a, field)
        problem = None if name is None else registry.problem(name)
        if problem:
            out.append(Problem(at(f"algorithm.{field}"), name, problem.rule, problem.fix))
    if out:
        return out
    for fn_field, args_field, registry, default in (
        ("policy_loss_fn", "policy_loss_args", POLICY_LOSS_FNS, preset.policy_loss_fn),
        ("advantage_fn", "advantage_args", ADVANTAGE_FNS, preset.advantage_fn),
    ):
        name = getattr(a, fn_field) or default
        args = getattr(a, args_field)
        if name is None or not args:
            continue
        try:
            part = "advantage" if fn_field == "advantage_fn" else "policy_loss"
            registry.check_args(name, {**preset.args_for(part, name), **args})
        except (TypeError, ValueError) as exc:
            out.append(
                Problem(
                    at(f"algorithm.{args_field}"),
                    args,
                    str(exc).strip("'\""),
                    f"use only the arguments '{name}' accepts",
                )
            )
    if preset.needs_rollouts and cfg.mode == "train" and cfg.buffer.storage is None:
        out.append(
            Problem(
                at("mode"),
                cfg.mode,
                f"algorithm '{preset.name}' learns from rollouts",
                "use mode: both; or mode train with buffer.storage, fed by a separate explore process",
            )
        )
    if preset.offline_data is not None and cfg.mode == "train":
        out.extend(_offline_trainer_problems(cfg, at, preset.offline_data))
    if cfg.trainer.share_prompts is True:  # the trainer's other reasons (images, attention) need the model
        why = why_not_shared(cfg.trainer.pack_length, False, ())
        if why:
            fix = "set trainer.share_prompts: auto (on where it can be) or false"
            out.append(
                Problem(at("trainer.share_prompts"), True, f"the shared-prompt layout, but {why}", fix)
            )
    if not preset.needs_rollouts and cfg.mode == "both":
        out.append(
            Problem(
                at("mode"), cfg.mode, f"algorithm '{preset.name}' trains from a dataset", "use mode: train"
            )
        )
    return out


# Fields an offline trainer (SFT, DPO: a dataset, no rollouts) does not act on: (path, value, its default,
# why); a value other than the default is refused. tests/config/test_inert_keys.py finds the ones missing.
def _offline_trainer_inert(cfg: TriviumConfig, kind: str) -> tuple[tuple[str, Any, Any, str], ...]:
    a, t = cfg.algorithm, cfg.trainer
    rollouts_only = (
        (
            "algorithm.rollout_is_cap",
            a.rollout_is_cap,
            None,
            "a dataset has no rollouts whose sampling policy needs correcting",
        ),
        (
            "algorithm.kl_penalty.coef",
            a.kl_penalty.coef,
            0.0,
            "the reward KL penalty shapes rollout rewards, and a dataset step has none (a pull to the reference: "
            + ("algorithm.kl_loss" if kind == "sft" else "algorithm.dpo.beta")
            + ")",
        ),
        (
            "algorithm.overlong_penalty.enabled",
            a.overlong_penalty.enabled,
            False,
            "the overlong penalty shapes the rewards of rollouts cut at max_tokens",
        ),
        (
            "algorithm.dynamic_sampling.enabled",
            a.dynamic_sampling.enabled,
            False,
            "dynamic sampling explores again for groups with reward variance; a dataset step explores nothing",
        ),
    )
    if kind != "preference":
        return rollouts_only
    return (
        *rollouts_only,
        ("algorithm.kl_loss.coef", a.kl_loss.coef, 0.0,
         "the DPO loss holds its own pull to the reference: algorithm.dpo.beta"),
        ("algorithm.entropy_coef", a.entropy_coef, 0.0, "the DPO loss has no entropy term"),
        ("trainer.ppo_epochs", t.ppo_epochs, 1, "DPO makes one pass over each batch of pairs"),
        ("trainer.mini_batch_size", t.mini_batch_size, 0,
         "DPO makes one update per batch: buffer.batch_size sets the pairs of a step"),
        ("trainer.pack_length", t.pack_length, None,
         "DPO pads each pair's rows (trainer.micro_batch_size / max_tokens_per_micro_batch bound memory)"),
    )  # fmt: skip


def _offline_trainer_problems(cfg: TriviumConfig, at, kind: str) -> list[Problem]:
    return [
        Problem(
            at(path),
            value,
            f"algorithm '{cfg.algorithm.algorithm_type}' does not use it: {why}",
            f"remove {path} (its default: {default}); in a multi-stage config, set it in the stage that "
            "uses it rather than at the top level, which every stage inherits",
        )
        for path, value, default, why in _offline_trainer_inert(cfg, kind)
        if value != default
    ]
