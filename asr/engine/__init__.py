"""The GPU-resident streaming recognizer: a fixed pool of slots advanced by one batched step
(`engine`), Mimi's streaming encoder and its C kernel, Kyutai STT's weights and words, and the
scheduler that feeds the step; `recognizer` puts it behind `asr.base.StreamingRecognizer`."""
