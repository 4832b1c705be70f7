"""Train a tiny GPT-2 on synthetic copy sequences with the Hugging Face Trainer."""
import argparse
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments


class CopyTask(torch.utils.data.Dataset):
    """Sequences whose second half repeats the first: something a tiny model learns fast."""

    def __init__(self, n, length=16, vocab=64, seed=0):
        g = torch.Generator().manual_seed(seed)
        half = torch.randint(0, vocab, (n, length // 2), generator=g)
        self.ids = torch.cat([half, half], dim=1)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Pace(TrainerCallback):
    def __init__(self, seconds):
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        print(f"global step {state.global_step}/{state.max_steps}")
        time.sleep(self.seconds)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", default="output")
    parser.add_argument("--max_steps", type=int, default=500)
    parser.add_argument("--save_steps", type=int, default=100)
    parser.add_argument("--step_sleep", type=float, default=0.0)
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in output_dir")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                                                bos_token_id=0, eos_token_id=0))
    training_args = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.max_steps, save_steps=args.save_steps,
        per_device_train_batch_size=8, learning_rate=1e-3, logging_steps=10, report_to="none",
        use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=CopyTask(4096), callbacks=[Pace(args.step_sleep)])
    result = trainer.train(resume_from_checkpoint=True if args.resume else None)
    print(f"finished at global step {trainer.state.global_step}, train loss {result.training_loss:.4f}")
    trainer.save_model()


if __name__ == "__main__":
    main()
