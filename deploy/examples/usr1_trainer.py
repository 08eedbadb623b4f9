"""A toy trainer that checkpoints when it gets SIGUSR1, as a real one would: the handler only
sets a flag, the training loop saves at the next step.

    usage: usr1_trainer.py CHECKPOINT_DIR [RESUME_FROM]

Writes ``step_N/shard_{0..3}.pt`` (4 MiB each, 0.5 s apart) and then ``DONE`` (the
``generic`` layout's completion marker). Used for the checkpoint schedule's example in
docs/design/checkpoints.md; exec it from the batch script (``exec python3 usr1_trainer.py DIR {resume_from}``).
"""

import os
import signal
import sys
import time

ckpt, resume = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")
save_now = False


def on_usr1(signum, frame):
    global save_now
    save_now = True


signal.signal(signal.SIGUSR1, on_usr1)
step = int(resume.rsplit("_", 1)[1]) if resume else 0
print(f"start at step {step} (resume from {resume or 'nothing'})", flush=True)
while True:
    time.sleep(0.2)
    step += 1
    if save_now:
        save_now = False
        d = os.path.join(ckpt, f"step_{step}")
        os.makedirs(d, exist_ok=True)
        for shard in range(4):  # four shards, written one after the other
            with open(os.path.join(d, f"shard_{shard}.pt"), "wb") as f:
                f.write(os.urandom(4 << 20))
            time.sleep(0.5)
        open(os.path.join(d, "DONE"), "w").close()
        print(f"saved step {step} on USR1", flush=True)
