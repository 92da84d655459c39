"""The CPU tier: INT8 ONNX models, confidence gate, escalation to the center."""
