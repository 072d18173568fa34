// Which steps evaluate, checkpoint, run HellaSwag and sample.
#pragma once

#include "args.h"

// The loop's schedule. At step N the parameters have had N updates; the last step (N = max_steps)
// only evaluates, checkpoints and samples. A resumed run does not rewrite the checkpoint it started
// from; checkpoints are taken before sampling, so a resumed run samples the same text.
inline bool is_val_step(const TrainArgs& args, int step, int max_steps) {
    return args.val_every > 0 && (step % args.val_every == 0 || step == max_steps);
}
inline bool is_checkpoint_step(const TrainArgs& args, int step, int start_step, int max_steps) {
    return args.checkpoint_every > 0 && step != start_step && (step % args.checkpoint_every == 0 || step == max_steps);
}
inline bool is_hellaswag_step(const TrainArgs& args, int step, int max_steps) {
    return args.hellaswag_every > 0 && (step % args.hellaswag_every == 0 || step == max_steps);
}
inline bool is_sample_step(const TrainArgs& args, int step, int max_steps) {
    return args.sample_every > 0 && ((step > 0 && step % args.sample_every == 0) || step == max_steps);
}
