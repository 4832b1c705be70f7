# train a miniature character-level model, small enough for a laptop's CPU

out_dir = 'out-shakespeare-char'
eval_interval = 10
eval_iters = 4
log_interval = 1
always_save_checkpoint = True

dataset = 'shakespeare_char'
batch_size = 16
block_size = 32
n_layer = 2
n_head = 2
n_embd = 32
learning_rate = 1e-3
max_iters = 60
