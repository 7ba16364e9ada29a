"""The decentralized BOFRF job (federated random forests) and its BOPPID baseline."""
