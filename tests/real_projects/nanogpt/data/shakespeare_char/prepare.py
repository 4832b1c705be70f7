"""
Prepare the character-level dataset: encode input.txt as integer ids into train.bin and val.bin
(uint16), and save the encoder and decoder in meta.pkl. Writes a small input.txt first if there is none.
"""
import os
import pickle
import random

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
input_file_path = os.path.join(here, 'input.txt')
if not os.path.exists(input_file_path):
    rng = random.Random(0)
    words = ['to', 'be', 'or', 'not', 'that', 'is', 'the', 'question', 'whether', 'tis', 'nobler', 'in', 'mind']
    with open(input_file_path, 'w') as f:
        f.write(' '.join(rng.choice(words) for _ in range(40000)))

with open(input_file_path) as f:
    data = f.read()
print(f"length of dataset in characters: {len(data):,}")

chars = sorted(set(data))
vocab_size = len(chars)
print(f"vocab size: {vocab_size:,}")
stoi = {ch: i for i, ch in enumerate(chars)}
itos = {i: ch for i, ch in enumerate(chars)}

n = len(data)
train_ids = np.array([stoi[c] for c in data[:int(n * 0.9)]], dtype=np.uint16)
val_ids = np.array([stoi[c] for c in data[int(n * 0.9):]], dtype=np.uint16)
print(f"train has {len(train_ids):,} tokens")
print(f"val has {len(val_ids):,} tokens")
train_ids.tofile(os.path.join(here, 'train.bin'))
val_ids.tofile(os.path.join(here, 'val.bin'))

with open(os.path.join(here, 'meta.pkl'), 'wb') as f:
    pickle.dump({'vocab_size': vocab_size, 'itos': itos, 'stoi': stoi}, f)
