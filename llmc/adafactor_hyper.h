// Adafactor's constants, shared by both trainers (llmc/adafactor.h on the CPU, llmc/adafactor.cuh on the
// GPU): torch.optim.Adafactor's defaults.
#pragma once

struct AdafactorHyper {
    double beta2_decay = -0.8;
    float eps1 = 1.0f / (1 << 23);  // torch.finfo(torch.float32).eps
    float eps2 = 1e-3f;
    float d = 1.0f;
};
