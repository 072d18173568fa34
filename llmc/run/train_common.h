// Host code of the training loop that the CPU and CUDA trainers share, one header per job:
//   train_state.h       what a state file holds beside the optimizer's vectors, resuming from one, and
//                       the end of every checkpoint
//   run_dir.h           who prints, the lock on -o, the checkpoint -y 1 resumes from
//   training_data.h     the loaders, accumulation steps and step count; the learning-rate schedule
//   run_description.h   the model's summary and the description all processes must agree on
//   step_schedule.h     which steps evaluate, checkpoint, run HellaSwag and sample
//   sample_text.h       printing a sample
#pragma once

#include "run_description.h"
#include "run_dir.h"
#include "sample_text.h"
#include "step_schedule.h"
#include "train_state.h"
#include "training_data.h"
