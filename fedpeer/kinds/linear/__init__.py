"""Logistic regression (exact Newton / L-BFGS, or FedAvg) and small neural networks by FedAvg."""
