"""Fine-tune a tiny GPT-2 the way the Hugging Face examples (run_clm.py) are written: every flag is
TrainingArguments' own (--learning_rate, --output_dir, --report_to, ...), read by HfArgumentParser."""
import sys
from dataclasses import dataclass, field

import torch
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainingArguments, set_seed


@dataclass
class ModelArguments:
    n_layer: int = field(default=2, metadata={"help": "transformer blocks"})
    n_embd: int = field(default=32, metadata={"help": "hidden size"})


class CopyTask(torch.utils.data.Dataset):
    def __init__(self, n, length=16, vocab=64, seed=0):
        g = torch.Generator().manual_seed(seed)
        half = torch.randint(0, vocab, (n, length // 2), generator=g)
        self.ids = torch.cat([half, half], dim=1)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    parser = HfArgumentParser((ModelArguments, TrainingArguments))
    model_args, training_args = parser.parse_args_into_dataclasses(args=sys.argv[1:])
    set_seed(training_args.seed)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=model_args.n_embd, n_layer=model_args.n_layer, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    trainer = Trainer(model=GPT2LMHeadModel(config), args=training_args, train_dataset=CopyTask(2048),
                      eval_dataset=CopyTask(256, seed=1))
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    metrics = trainer.evaluate()
    print(f"eval_loss={metrics['eval_loss']:.4f}")


if __name__ == "__main__":
    main()
