"""Federated XGBoost: exact histogram mode over secure sums, and tree bagging run by the elected
leader."""
