// Model files, optimizer state files and checkpoint directories, one header each:
//   model_file.h       the model file (llm.c's format, with our checksums) and what a reader refuses
//   state_file.h       a process's optimizer state file (ours): the step, data position, sampler, loss
//                      scaler and the optimizer's vectors of its shard
//   checkpoint_dir.h   a checkpoint's files in a directory, its DONE marker, resume's search and clean-up
#pragma once

#include "checkpoint_dir.h"
#include "model_file.h"
#include "state_file.h"
