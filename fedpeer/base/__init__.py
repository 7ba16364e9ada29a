"""What every layer needs: structured log lines, atomic files under the state directory, files that
hold a secret."""
