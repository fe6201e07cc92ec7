"""Demonstrations for SFT: prompt/response rows turned into experiences with loss on the response only.

Rows are read and checked by the same ``TaskSetReader`` as task sets (so a bad row gets the same error
naming its file, row and field); each row becomes the chat-templated prompt followed by the response
tokens and EOS. Only response tokens (EOS included) are action tokens.
"""

from __future__ import annotations

import torch

from trivium.buffer.task_reader import TaskSetReader
from trivium.config.schema import SftDatasetConfig
from trivium.types import Experience, Task

SFT_FIELDS = {"prompt": (str,), "response": (str,)}


class SftReader:
    def __init__(self, cfg: SftDatasetConfig, tokenizer, seed: int = 0):
        self.tokenizer = tokenizer
        self.system_prompt = cfg.system_prompt
        self.reader = TaskSetReader(
            cfg.path,
            name="sft",
            fields={"prompt": "prompt", "response": "response", **cfg.fields},
            required=SFT_FIELDS,
            workflow="sft",
            reward_fn="none",
            repeat_times=1,
            on_bad_row=cfg.on_bad_row,
            shuffle=cfg.shuffle,
            seed=seed,
            max_rows=cfg.max_rows,
        )

    def __len__(self) -> int:
        return len(self.reader)

    def next_batch(self, batch_size: int) -> list[Experience]:
        return [self.to_experience(t) for t in self.reader.next_batch(batch_size)]

    def to_experience(self, task: Task) -> Experience:
        tok = self.tokenizer
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": task.data["prompt"]})
        prompt_text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt = tok(prompt_text, add_special_tokens=False)["input_ids"]
        response = tok(task.data["response"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        n = len(response)
        return Experience(
            tokens=torch.tensor(prompt + response, dtype=torch.long),
            prompt_length=len(prompt),
            action_mask=torch.ones(n, dtype=torch.bool),
            logprobs=torch.zeros(n, dtype=torch.float32),
            reward=0.0,
            task_id=task.task_id,
        )

    def state_dict(self) -> dict:
        return self.reader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.reader.load_state_dict(state)
