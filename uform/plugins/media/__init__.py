"""What the modality plugins read, prepared on the host: a module a medium (files, image,
video, audio, text) and the pixel geometry images and video share (frames)."""
