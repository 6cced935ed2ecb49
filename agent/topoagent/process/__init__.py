"""This host's training processes: started and supervised (`launch`), the carrier of the links
they use watched (`linkwatch`). The processes run the training runtime (`topotrain`), which this
package never imports: it starts the plan's command."""
