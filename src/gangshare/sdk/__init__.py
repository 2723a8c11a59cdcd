"""The training SDK used inside worker pods: reports step times, obeys memory and SM caps."""
